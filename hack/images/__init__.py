"""OCI images for the local clusters' nodes, built without Docker or a registry: image-layout tars
for ``ctr -n k8s.io images import``, cached in ``<cache>/images`` by the hash of their inputs.

``python -m hack.images build`` builds them; ``build_images()`` is the API the cluster code calls.
"""

from .build import build_images
from .cache import BuiltImage
from .small import binary_image
from .tools import BuildError

__all__ = ["BuildError", "BuiltImage", "binary_image", "build_images"]
