// Text typed, pasted, cut, dropped or filled into the prompt or the system prompt (any native
// input event, which gradio's own `input` event is not: it comes with key presses only) marks
// the next change of that box as made by hand: branches/section.py's change event then drops a
// branch's given ids. A value the page sets (a link, a branch, a restored run) fires no native
// input event, and keeps them.
if (!window.tlLeaveInstalled) {
  window.tlLeaveInstalled = true;
  window.tlByHand = {};
  document.addEventListener('input', (e) => {
    const box = e.target?.closest?.('#prompt, #system');
    if (box && e.target.matches('textarea, input')) window.tlByHand[box.id] = true;
  }, true);
}
