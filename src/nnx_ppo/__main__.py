"""``python -m nnx_ppo``: the same as the ``nnx-ppo`` command."""

import sys

from nnx_ppo.cli.main import main

sys.exit(main())
