"""A page that keeps your work: settings, the conversation, the branch tree and the run on view, in the browser's storage."""
