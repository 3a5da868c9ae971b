// A reload, a link followed or a closed tab cuts the streams of the events still going (a run's
// tokens): gradio's client closes them in its beforeunload listener (registered before any script
// of ours can be: a "leaving" flag would come too late) and logs the cut as two errors,
// "AbortError: signal is aborted without reason", then "Unexpected error Connection errored out.".
// An aborted request is one the page ended on purpose, not an error: it is not logged, nor the
// broken-connection line that follows it within a second. A connection lost any other way (the
// server gone: no AbortError before it) is still logged, as is every other error.
(() => {
  if (window.tlQuietCut) return;
  window.tlQuietCut = true;
  let cutAt = -Infinity;
  const aborted = (x) => !!x && (x.name === 'AbortError' || /^AbortError\b/.test(String(x.stack || x.message || x)));
  const error = console.error.bind(console);
  console.error = (...args) => {
    if (args.some(aborted)) {
      cutAt = performance.now();
      return;
    }
    if (performance.now() - cutAt < 1000 && args.some((a) => /Connection errored out/.test(String(a)))) return;
    error(...args);
  };
  window.addEventListener('unhandledrejection', (e) => { if (aborted(e.reason)) e.preventDefault(); });
})();
