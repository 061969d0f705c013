from mqttfl.commands.main import main

raise SystemExit(main())
