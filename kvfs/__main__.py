from kvfs.cli import main

raise SystemExit(main())
