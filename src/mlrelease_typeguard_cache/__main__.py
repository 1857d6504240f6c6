"""`python -m mlrelease_typeguard_cache`: write the activating .pth into this environment's site-packages."""

import sysconfig
from pathlib import Path

from mlrelease_typeguard_cache import install_pth

print(install_pth(Path(sysconfig.get_paths()["purelib"])))
