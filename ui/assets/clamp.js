() => {
  // A number typed into a setting's slider beyond its range: gradio puts the slider at the nearest
  // end when the box loses focus, silently. Say so under the field, naming it; a value in range
  // takes the note away.
  const check = (e) => {
    const input = e.target;
    if (!input || !input.matches || !input.matches('.tl-setting input[type=number]')) return;
    const block = input.closest('.tl-setting');
    const v = parseFloat(input.value), lo = parseFloat(input.min), hi = parseFloat(input.max);
    const name = (input.getAttribute('aria-label') || 'this setting').replace(/^number input for /, '');
    let text = '';
    if (v > hi) text = `${name}: ${input.value} is above the maximum ${hi}, so ${hi} is used.`;
    else if (v < lo) text = `${name}: ${input.value} is below the minimum ${lo}, so ${lo} is used.`;
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
  return [];
}
