"""What the page's sections share, below all of them: a run as the page shows it (view.py,
card.py, kv.py, charts.py), the names of the components a run's events set (outputs.py), the
branch tree's data (tree.py), the conversation (conversation.py), the downloads (downloads.py)
and runs: the one prepared request every section starts a run with, and its stream (runs.py).
No section imports another; each imports these."""
