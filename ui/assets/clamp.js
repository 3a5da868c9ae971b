() => {
  // A number typed into a setting's field beyond its range. A slider: gradio puts it at the
  // nearest end when the box loses focus, silently. A number box (no slider): nothing moves it,
  // and a run refuses it. Say so under the field, naming it, as it is typed and when it loses
  // focus; a value in range takes the note away.
  const check = (e) => {
    const input = e.target;
    if (!input || !input.matches || !input.matches('.tl-setting input[type=number]')) return;
    const block = input.closest('.tl-setting');
    const v = parseFloat(input.value), lo = parseFloat(input.min), hi = parseFloat(input.max);
    // A slider's box is "number input for <label>"; a number box's label ends with what its
    // off value means, "(0 = off)".
    const name = (input.getAttribute('aria-label') || 'this setting')
      .replace(/^number input for /, '').replace(/ \([^()]*\)$/, '');
    const slider = !!block.querySelector('input[type=range]');
    const then = (end) => (slider ? `, so ${end} is used.` : ': a run refuses it.');
    let text = '';
    if (v > hi) text = `${name}: ${input.value} is above the maximum ${hi}${then(hi)}`;
    else if (v < lo) text = `${name}: ${input.value} is below the minimum ${lo}${then(lo)}`;
    let note = block.querySelector('.tl-clamped');
    if (!text) { if (note) note.remove(); return; }
    if (!note) {
      note = document.createElement('div');
      note.className = 'tl-clamped';
      note.setAttribute('role', 'status');
      block.appendChild(note);
    }
    note.textContent = text;
  };
  document.addEventListener('blur', check, true);  // before gradio's own blur handler clamps it
  document.addEventListener('input', check, true);
  return [];
}
