"""Packages for setuptools; everything else is in pyproject.toml.

The repository keeps its bundled data (the toy checkpoint, the text probe) at the top level in
``data/``; wheels and sdists ship it inside the package as ``interp.data``, where
``importlib.resources`` finds it (see ``interp._io.bundled``). pyproject's ``packages.find`` cannot
add a package that lives outside ``interp/``, hence these few lines.
"""

from setuptools import find_packages, setup

DATA = ["interp.data", "interp.data.toy", "interp.data.text"]

setup(
    packages=[*find_packages(include=["interp", "interp.*"]), *DATA],
    package_dir={"interp.data": "data"},
    package_data={name: ["*"] for name in DATA},
)
