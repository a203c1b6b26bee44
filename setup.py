"""Which folders the kvferry wheel holds; everything else about the package is in pyproject.toml.

The component folders live at the top level (DESIGN.md §1) and map into the package, so an installed
wheel holds kvferry/operator/... without an operator/__init__.py in the checkout. Their subpackages are
discovered, not listed: a listed set once missed kvferry.router.scheduling, which the editable install
hid and the wheel lacked.
"""

from setuptools import find_namespace_packages, setup

COMPONENT_FOLDERS = ("engine", "kvcache", "kernels", "transfer", "prefill_node", "decode_node", "router", "operator")
SKIPPED = ["*__pycache__*", "data", "data.*"]


def packages_in(folder: str, package: str) -> dict[str, str]:
    """The package and every subpackage under `folder` (namespace folders too), mapped to their folders."""
    found = {package: folder}
    for sub in find_namespace_packages(where=folder, exclude=SKIPPED):
        found[f"{package}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"
    return found


package_dir = packages_in("kvferry", "kvferry")
for component in COMPONENT_FOLDERS:
    package_dir |= packages_in(component, f"kvferry.{component}")

setup(package_dir=package_dir, packages=sorted(package_dir))
