"""Which packages the wheel holds; every other packaging setting is in pyproject.toml.

The repository's top-level ``configs/`` folder is mapped onto the subpackage
``dicosa.configs``, so that a wheel carries the YAML configs as package data (read by
``dicosa.config.config_dir``) while that folder stays their one copy. pyproject.toml's
``packages.find`` cannot add a package that lives outside the package's own folder.
"""

from setuptools import find_namespace_packages, setup

setup(
    packages=[*find_namespace_packages(include=["dicosa", "dicosa.*"],
                                       exclude=["*.__pycache__"]),
              "dicosa.configs"],
    package_dir={"dicosa.configs": "configs"},
)
