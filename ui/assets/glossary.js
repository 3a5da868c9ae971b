() => {
  // The glossary's definitions (ui/glossary.py) on hover, tap and keyboard focus: a term is a
  // focusable .tl-term whose aria-describedby names its definition in the page's hidden list
  // (#glossary-defs), which screen readers read as its description. One floating tooltip shows
  // it, placed in the window (never cut by a scrolling table). The labels of the controls whose
  // words are a term (Top-p, Mirostat τ, Beams...) are made such terms here, once each.
  if (window.tlGlossary) return [];
  window.tlGlossary = true;
  const tip = document.createElement('div');
  tip.id = 'tl-tip';
  tip.setAttribute('role', 'tooltip');
  tip.hidden = true;
  document.body.appendChild(tip);
  let current = null;
  const definition = (el) => document.getElementById(el.getAttribute('aria-describedby') || '');
  const place = (el) => {
    const r = el.getBoundingClientRect();
    tip.style.maxWidth = Math.min(340, window.innerWidth - 16) + 'px';
    const w = tip.offsetWidth, h = tip.offsetHeight;
    const x = Math.min(Math.max(8, r.left), window.innerWidth - w - 8);
    let y = r.bottom + 6;
    if (y + h > window.innerHeight - 8) y = Math.max(8, r.top - h - 6);
    tip.style.left = x + 'px';
    tip.style.top = y + 'px';
  };
  const show = (el) => {
    const d = definition(el);
    if (!d) return;
    current = el;
    tip.replaceChildren();
    const name = document.createElement('b');
    name.textContent = d.dataset.term + ': ';
    tip.append(name, d.textContent);
    tip.hidden = false;
    place(el);
  };
  const hide = () => { current = null; tip.hidden = true; };
  const termOf = (e) => e.target && e.target.closest ? e.target.closest('.tl-term') : null;
  document.addEventListener('mouseover', (e) => {
    const t = termOf(e);
    if (t && t !== current) show(t);
    else if (!t && current && document.activeElement !== current) hide();
  });
  document.addEventListener('focusin', (e) => { const t = termOf(e); if (t) show(t); });
  // A tap (or a click) on a term: it takes the focus, so the definition stays until a tap elsewhere.
  document.addEventListener('click', (e) => { const t = termOf(e); if (t) { t.focus(); show(t); } });
  document.addEventListener('focusout', (e) => { if (termOf(e) === current) hide(); });
  document.addEventListener('keydown', (e) => { if (e.key === 'Escape') hide(); });
  window.addEventListener('scroll', () => { if (current) place(current); }, true);

  // Labels: "Replay Top-p", "B Min-p", "Top-k (0 = off)" are the term Top-p, Min-p, Top-k.
  let terms = null;
  const index = () => {
    const list = document.querySelectorAll('#glossary-defs [data-term]');
    if (!list.length) return null;
    const map = new Map();
    list.forEach((d) => map.set(d.dataset.term.toLowerCase(), d.id));
    return map;
  };
  const find = (text) => {
    const bare = text.replace(/^(Replay|B) /, '').replace(/\s*\(.*$/, '').trim().toLowerCase();
    if (terms.has(bare)) return terms.get(bare);
    if (terms.has(bare.replace(/s$/, ''))) return terms.get(bare.replace(/s$/, ''));
    return null;
  };
  const decorate = () => {
    terms = terms || index();
    if (!terms) return;
    document.querySelectorAll('[data-testid="block-info"]:not([data-tl-glossed])').forEach((label) => {
      label.dataset.tlGlossed = '1';
      const node = [...label.childNodes].find((n) => n.nodeType === 3 && n.textContent.trim());
      const id = node && find(node.textContent);
      if (!id) return;
      const span = document.createElement('span');
      span.className = 'tl-term';
      span.tabIndex = 0;
      span.setAttribute('aria-describedby', id);
      span.dataset.term = document.getElementById(id).dataset.term;
      node.parentNode.insertBefore(span, node);
      span.appendChild(node);  // the same text node, inside: gradio still updates it
    });
  };
  let pending = null;
  new MutationObserver(() => {
    if (pending === null) pending = setTimeout(() => { pending = null; decorate(); }, 400);
  }).observe(document.body, {childList: true, subtree: true});
  decorate();
  return [];
}
