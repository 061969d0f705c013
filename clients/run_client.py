"""Device entry point: `python clients/run_client.py --run ID --id 3 --broker mqtt://host:1883`.

The same as `mqttfl client ...`, for devices where the console script is not on PATH.
"""

import sys

from mqttfl.commands.main import main

if __name__ == "__main__":
    sys.exit(main(["client", *sys.argv[1:]]))
