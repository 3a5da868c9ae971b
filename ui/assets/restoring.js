() => {
  // Until the page has applied its link's settings and the work saved in this browser (the
  // restored mark on body), its controls wait: anything typed or chosen sooner would be replaced
  // by them. The styles keep the pointer out (work.css); this keeps the keyboard out, and says
  // the controls are busy. Tab still moves on.
  const cols = ['#input-col', '#settings-col'];
  const waiting = () => document.body.dataset.tlRestored !== '1';
  if (waiting()) cols.forEach((c) => document.querySelector(c)?.setAttribute('aria-busy', 'true'));
  const hold = (e) => {
    if (!waiting() || !e.target?.closest?.(cols.join(','))) return;
    if (e.type === 'keydown' && e.key === 'Tab') return;
    e.preventDefault();
    e.stopImmediatePropagation();
  };
  for (const type of ['beforeinput', 'keydown', 'paste', 'drop', 'pointerdown', 'click']) {
    document.addEventListener(type, hold, true);
  }
  return [];
}
