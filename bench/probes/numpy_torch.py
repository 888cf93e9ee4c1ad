"""Does torch work with the venv's NumPy? Imports both, hands torch a NumPy array, prints "ok".

Read by apexkit.venvrun.numpy_works_with_torch, which also looks at stderr: torch wheels built against NumPy 1.x
(torch 2.1, 2.2) print "compiled using NumPy 1.x" / "Failed to initialize NumPy" there and lose torch.from_numpy
next to NumPy 2. torch_npu is not auto-loaded (unless the environment says otherwise): that needs CANN.
"""

import os

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
import numpy
import torch

torch.from_numpy(numpy.zeros(1))
print("ok")
