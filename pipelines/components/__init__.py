"""The KFP lightweight components, one module each; their bodies call `envace.stages` only.

Imports happen inside the component functions: KFP ships each function's source to the pod, where
the image (`envace-cpu` / `envace-gpu`, built from docker/) provides envace and kfp.
"""

DEFAULT_IMAGE = "envace-cpu:0.1.0"

__all__ = ["DEFAULT_IMAGE"]
