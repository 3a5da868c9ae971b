// A click (or Enter) on one of this component's [data-pick] elements: a gr.SelectData whose
// value is its data-pick (a candidate's "step:token id" in the bars, a branch's index in the tree).
const pickOne = (e) => {
  const t = e.target.closest('[data-pick]');
  if (!t || !element.contains(t)) return;
  trigger('select', {index: 0, value: t.dataset.pick, selected: true});
};
element.addEventListener('click', pickOne);
element.addEventListener('keydown', (e) => {
  if ((e.key === 'Enter' || e.key === ' ') && e.target.closest('[data-pick]')) { e.preventDefault(); pickOne(e); }
});
