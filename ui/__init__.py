"""The Gradio page. Importing it turns off what would call outside the machine: Gradio's
analytics and version check, and the Hugging Face hub's telemetry and lookups (Gradio imports
huggingface_hub). A user who wants them sets these variables before starting."""

import os

for _name, _value in {"GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1",
                      "HF_HUB_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1"}.items():
    os.environ.setdefault(_name, _value)
