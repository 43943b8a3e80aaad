from spanflow.cli.main import main

raise SystemExit(main())
