"""apexkit: build Apex for Ascend wheels for any Python x torch x torch_npu x arch.

The host-side library. It never imports torch: it runs the target venv's interpreter instead.
"""

__version__ = "0.1.0"
