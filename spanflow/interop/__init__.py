"""Models and clients from elsewhere: Hugging Face token classification, spaCy pipelines."""
