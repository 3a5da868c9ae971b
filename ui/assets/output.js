// The generated text (our own HTML): a click, or Enter on a focused token, selects its step
// (a gr.SelectData whose index is the chip's). Hover and focus show its popover (CSS).
const pick = (e) => {
  const t = e.target.closest('[data-i]');
  if (!t || !element.contains(t)) return;
  trigger('select', {index: Number(t.dataset.i), value: t.dataset.i, selected: true});
};
element.addEventListener('click', pick);
element.addEventListener('keydown', (e) => {
  if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); pick(e); }
  if (e.key === 'Escape' && e.target.closest('.tl-t')) e.target.closest('.tl-t').blur();  // closes its popover
});
// The popover is placed in the window (position: fixed), so that the output's scroll box
// does not clip it: below the token, or above it near the window's bottom; hidden while its
// token is scrolled out of the output's box.
const place = (t) => {
  const pop = t && t.querySelector(':scope > .tl-pop');
  if (!pop) return;
  const r = t.getBoundingClientRect(), box = t.closest('.tl-out').getBoundingClientRect();
  pop.style.position = 'fixed';
  pop.style.visibility = r.bottom < box.top || r.top > box.bottom ? 'hidden' : '';
  const w = pop.offsetWidth, h = pop.offsetHeight;
  pop.style.left = Math.max(4, Math.min(r.left, window.innerWidth - w - 4)) + 'px';
  // Above the token only near the window's bottom, and never over what is above the text (a
  // phone's "Score the text" button sits right above the scored text).
  const above = r.top - h - 4;
  pop.style.top = (r.bottom + h + 8 > window.innerHeight && above >= box.top ? above : r.bottom + 4) + 'px';
};
const placeTarget = (e) => place(e.target.closest('.tl-t'));
element.addEventListener('mouseover', placeTarget);
element.addEventListener('focusin', placeTarget);
// A popover left open (a tapped token keeps focus) follows its token as the page or the output scrolls.
const follow = () => element.querySelectorAll('.tl-t:focus, .tl-t:hover').forEach(place);
window.addEventListener('scroll', follow, {capture: true, passive: true});
window.addEventListener('resize', follow, {passive: true});
