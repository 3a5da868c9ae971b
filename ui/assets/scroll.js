() => {
  // A table wider than its box scrolls sideways inside it, and on a phone nothing showed that it
  // does (a touch screen's scroll bars appear only while scrolling). Each such box is marked with
  // the sides where more of the table lies (data-tl-more: "right", "left" or "left right"), which
  // page.css fades, and a line above it says which way to scroll. Tables come and go with every
  // update (Markdown and HTML components), so the marks follow the DOM.
  const MUCH_PX = 40, MUCH_SHARE = 0.1;  // hidden beyond these, the hint says it in words
  const HINTS = {right: 'scroll sideways for more →', left: '← scroll back', 'left right': '← scroll sideways →'};
  const boxOf = (table) => {  // the table itself (display: block) or a wrapper that scrolls
    for (let e = table, i = 0; e && i < 4; e = e.parentElement, i++) {
      if (/(auto|scroll)/.test(getComputedStyle(e).overflowX)) return e;
    }
    return null;
  };
  const mark = (box) => {
    // A table's own border may stick out of its box by a pixel or two: that is not more of it.
    const over = box.scrollWidth - box.clientWidth;
    const more = over <= 3 ? '' : [box.scrollLeft > 1 ? 'left' : '', box.scrollLeft < over - 1 ? 'right' : '']
      .filter(Boolean).join(' ');
    if ((box.dataset.tlMore || '') !== more) {
      if (more) box.dataset.tlMore = more; else delete box.dataset.tlMore;
    }
    let hint = box.previousElementSibling;
    if (!hint || !hint.classList.contains('tl-scroll-hint')) {
      if (!more || over <= Math.max(MUCH_PX, MUCH_SHARE * box.clientWidth)) return;
      hint = document.createElement('div');
      hint.className = 'tl-scroll-hint';
      hint.setAttribute('aria-hidden', 'true');  // what it says, the table's own cells say to a screen reader
      box.before(hint);
    }
    if (hint.textContent !== (HINTS[more] || '')) hint.textContent = HINTS[more] || '';
    // The fade shows any part hidden; the words only where much is (a sliver is seen at a glance).
    hint.hidden = !more || over <= Math.max(MUCH_PX, MUCH_SHARE * box.clientWidth);
  };
  // A box's width changes without a change below it (an accordion or a tab opening, the window).
  const resized = new ResizeObserver((entries) => entries.forEach((e) => mark(e.target)));
  let watched = new Set();
  const update = () => {
    const boxes = new Set();
    document.querySelectorAll('table').forEach((t) => {
      const box = boxOf(t);
      if (!box || boxes.has(box)) return;
      boxes.add(box);
      if (!watched.has(box)) {
        box.addEventListener('scroll', () => mark(box), {passive: true});
        resized.observe(box);
      }
      mark(box);
    });
    watched.forEach((box) => { if (!boxes.has(box)) resized.unobserve(box); });  // gone: let it go
    watched = boxes;
    // A hint whose box was replaced (a component's new value) goes with it.
    document.querySelectorAll('.tl-scroll-hint').forEach((h) => {
      if (!boxes.has(h.nextElementSibling)) h.remove();
    });
  };
  let queued = false;
  const later = () => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => { queued = false; update(); });
  };
  // Our own hints change the DOM too: only others' changes call for a pass.
  const ours = (n) => (n.nodeType === 1 ? n : n.parentElement)?.classList?.contains('tl-scroll-hint');
  const theirs = (r) => {
    const nodes = [...r.addedNodes, ...r.removedNodes];
    return !ours(r.target) && !(nodes.length && nodes.every(ours));
  };
  new MutationObserver((records) => { if (records.some(theirs)) later(); })
    .observe(document.body, {childList: true, subtree: true, characterData: true});
  later();
  return [];
}
