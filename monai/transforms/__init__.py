"""Only the point helpers VISTA3D calls are carried (``monai.transforms.utils``)."""

from monai.utils.module import not_carried_names

# `from monai.transforms import utils` imports the carried module; `from monai.transforms import Compose` says that
# MONAI's transform library is not part of this fork
__getattr__ = not_carried_names(__name__)
