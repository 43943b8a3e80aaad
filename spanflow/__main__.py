from spanflow.cli import entry

raise SystemExit(entry())
