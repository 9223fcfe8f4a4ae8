"""gear's Python package: ctypes and numpy over libgear (built by `make
python` into gear/). Install without network access:

    make python
    /usr/bin/python3 -m pip install --no-build-isolation --break-system-packages ./python
"""

from setuptools import setup

setup(
    name="gear",
    version="0.1.0",
    description="gear's replay tables, world and parameter service for Python (ctypes over libgear)",
    packages=["gear"],
    package_data={"gear": ["libgear.so", "gear.h"]},
    install_requires=["numpy"],
    python_requires=">=3.9",
    zip_safe=False,
)
