// The full attention pattern: hovering a cell highlights its query row's and key column's
// tokens and says which looks at which, with the weight.
element.addEventListener('mouseover', (e) => {
  element.querySelectorAll('.tl-hl').forEach((x) => x.classList.remove('tl-hl'));
  const td = e.target.closest('td[data-q]');
  const info = element.querySelector('.tl-pat-info');
  if (!td || !info) return;
  const q = td.dataset.q, k = td.dataset.k;
  const qh = element.querySelector('th.tl-q[data-q="' + q + '"]');
  const kh = element.querySelector('th.tl-k[data-k="' + k + '"]');
  [td, qh, kh].forEach((x) => x && x.classList.add('tl-hl'));
  const qt = qh ? qh.textContent.replace(/^\d+ /, '') : '', kt = kh ? kh.textContent : '';
  info.textContent = 'query ' + q + ' ' + qt + ' → key ' + k + ' ' + kt + ': weight ' + td.dataset.w;
});
