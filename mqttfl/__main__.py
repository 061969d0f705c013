from mqttfl.cli import main

raise SystemExit(main())
