from inference.cli import main

raise SystemExit(main())
