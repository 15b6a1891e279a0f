from turboinfer.cli import main

raise SystemExit(main())
