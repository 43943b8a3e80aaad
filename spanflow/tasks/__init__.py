"""Tasks: the registry and protocols (registry.py), what task authors import (api.py), and one
folder per task (ner/, re/, embed/)."""
