"""Generate a pair of git repositories shaped like NVIDIA apex and Ascend apex, reproducing the real traps.

Written for these tests; no upstream code. What matches the real pair (Ascend apex master, NVIDIA apex 4ef930c):
- "NVIDIA apex": setup.py that builds apex_C from csrc/flatten_unflatten.cpp with --cpp_ext, version '0.1';
  the pinned commit is not the branch head (a later commit exists, as upstream).
- "Ascend apex": patch/npu.patch (diff -Nur of the two trees, applied with patch -p1) rewriting setup.py with a
  get_package_dir() that hard-codes sys.prefix/lib/pythonX.Y/site-packages (its --user branch uses `site` without
  importing it), version '0.1-ascend', link args ending in a bare '-Wl,--disable-new-dtags,--rpath', a second
  extension change_data_ptr whose source comes from src/; apex/__init__.py importing torch_npu; src/ and tests/
  copied over the tree; scripts/build.sh that clones NVIDIA apex again and pins the commit with `git checkout`.
- The C++ sources include a light torch header (c10) and link libc10, so a compile takes seconds, not minutes,
  while a missing torch include/lib dir fails exactly like the real build.
Branches: master (all traps), 5.0.rc3 (no bare --rpath), drift (get_package_dir reshaped: our patch must refuse).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

GIT_ENV = {
    "GIT_AUTHOR_NAME": "fixture",
    "GIT_AUTHOR_EMAIL": "fixture@example.invalid",
    "GIT_COMMITTER_NAME": "fixture",
    "GIT_COMMITTER_EMAIL": "fixture@example.invalid",
    "GIT_AUTHOR_DATE": "2020-08-14T00:00:00Z",
    "GIT_COMMITTER_DATE": "2020-08-14T00:00:00Z",
}

C_MODULE = """\
// Fixture extension: a CPython module that uses a c10 header and libc10, like the real ones use torch.
#include <Python.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <string>

static PyObject* dtype_name(PyObject*, PyObject*) {{
  // c10::Device(std::string) and str() live in libc10.so: the module really links torch's library.
  std::string s = c10::Device("cpu").str() + ":" + c10::toString(c10::ScalarType::{dtype});
  return PyUnicode_FromString(s.c_str());
}}
static PyMethodDef methods[] = {{
  {{"dtype_name", dtype_name, METH_NOARGS, "c10's name of a dtype"}},
  {{nullptr, nullptr, 0, nullptr}}}};
static struct PyModuleDef module_def = {{PyModuleDef_HEAD_INIT, "{name}", nullptr, -1, methods}};
PyMODINIT_FUNC PyInit_{name}(void) {{ return PyModule_Create(&module_def); }}
"""

# Shaped like Ascend master's src/csrc/combine_tensors/change_dataptr.cpp (same signature, the same checks in the
# same words and order, the same pointer arithmetic), written for these tests: the tensors are read through a small
# view of the Python object (numel(), element_size(), dtype, untyped_storage()._cdata, the StorageImpl*), so it needs
# c10 only (seconds to compile, not torch/extension.h's minutes). c10/core/StorageImpl.h of torch >= 2.14 needs
# C++20 (std::strong_ordering), so npu.patch's -std=c++17 fails here as it does on the real file.
CHANGE_DATAPTR = """\
// Fixture of Ascend apex's change_dataptr.cpp: aliases dst's storage into src's at an offset (in elements).
#include <Python.h>
#include <c10/core/StorageImpl.h>
#include <stdexcept>
#include <string>

namespace fixture {
struct python_error {};  // a Python exception is already set

struct Tensor {
  PyObject* obj;
  PyObject* call(const char* method) const {
    PyObject* out = PyObject_CallMethod(obj, method, nullptr);
    if (out == nullptr) throw python_error();
    return out;
  }
  int64_t as_int(PyObject* value) const {
    long long v = PyLong_AsLongLong(value);
    Py_DECREF(value);
    if (v == -1 && PyErr_Occurred()) throw python_error();
    return v;
  }
  int64_t numel() const { return as_int(call("numel")); }
  int64_t element_size() const { return as_int(call("element_size")); }
  std::string scalar_type() const {
    PyObject* dtype = PyObject_GetAttrString(obj, "dtype");
    if (dtype == nullptr) throw python_error();
    PyObject* name = PyObject_Str(dtype);
    Py_DECREF(dtype);
    if (name == nullptr) throw python_error();
    std::string out = PyUnicode_AsUTF8(name);
    Py_DECREF(name);
    return out;
  }
  c10::StorageImpl* storage() const {
    PyObject* storage = call("untyped_storage");
    PyObject* cdata = PyObject_GetAttrString(storage, "_cdata");
    Py_DECREF(storage);
    if (cdata == nullptr) throw python_error();
    return static_cast<c10::StorageImpl*>(PyLong_AsVoidPtr(cdata));
  }
};
}  // namespace fixture

void change_data_ptr(fixture::Tensor dst, fixture::Tensor src, int offset)
{
  if (offset < 0) {
    throw std::runtime_error("Expect offset equal or greater than zero, got: " + std::to_string(offset));
  }

  const auto src_scalar_type = src.scalar_type();
  const auto dst_scalar_type = dst.scalar_type();

  if ((src_scalar_type != dst_scalar_type) ||
      ((src_scalar_type != "torch.float16") && (src_scalar_type != "torch.float32"))) {

    throw std::runtime_error(
      "Expect src and dst tensors having the same dtype in float16 or float32.");
  }

  if (dst.numel() * dst.element_size() + offset > src.numel() * src.element_size()) {
    throw std::runtime_error("Offsets overflow in change_data_ptr.");
  }

  if (src.storage()->data() == nullptr) {
    throw std::runtime_error("Null storage or data_ptr in change_data_ptr.");
  }

  char* data_ptr = static_cast<char*>(src.storage()->mutable_data()) + offset * src.element_size();
  c10::DataPtr aim_data_ptr = c10::DataPtr(data_ptr, dst.storage()->device());
  dst.storage()->set_data_ptr(std::move(aim_data_ptr));
}

static PyObject* py_change_data_ptr(PyObject*, PyObject* args) {
  PyObject *dst, *src;
  int offset;
  if (!PyArg_ParseTuple(args, "OOi", &dst, &src, &offset)) return nullptr;
  try {
    change_data_ptr(fixture::Tensor{dst}, fixture::Tensor{src}, offset);
  } catch (const fixture::python_error&) {
    return nullptr;
  } catch (const std::exception& exc) {
    PyErr_SetString(PyExc_RuntimeError, exc.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}
static PyMethodDef methods[] = {
  {"change_data_ptr", py_change_data_ptr, METH_VARARGS, "Change data ptr"},
  {nullptr, nullptr, 0, nullptr}};
static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "change_data_ptr", nullptr, -1, methods};
PyMODINIT_FUNC PyInit_change_data_ptr(void) { return PyModule_Create(&module_def); }
"""

NVIDIA_SETUP = """\
import torch
from torch.utils import cpp_extension
from setuptools import setup, find_packages
import subprocess

import sys
import warnings
import os

# fixture of the upstream layout: extensions only with flags
this_dir = os.path.dirname(os.path.abspath(__file__))

cmdclass = {}
ext_modules = []

if "--cpp_ext" in sys.argv:
    from torch.utils.cpp_extension import BuildExtension, CppExtension
    sys.argv.remove("--cpp_ext")
    cmdclass['build_ext'] = BuildExtension
    ext_modules.append(
        CppExtension('apex_C',
                     ['csrc/flatten_unflatten.cpp',]))

setup(
    name='apex',
    version='0.1',
    packages=find_packages(exclude=('build',
                                    'csrc',
                                    'include',
                                    'tests',)),
    description='PyTorch Extensions written by NVIDIA',
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
"""

ASCEND_SETUP = """\
import sys
import warnings
import os
import glob
import subprocess
from setuptools.command.build_ext import build_ext
from setuptools import setup, find_packages, Extension

import torch

# ninja build does not work unless include_dirs are abs path
this_dir = os.path.dirname(os.path.abspath(__file__))

cmdclass = {}
ext_modules = []

TORCH_MAJOR = int(torch.__version__.split('.')[0])
TORCH_MINOR = int(torch.__version__.split('.')[1])

secure_compile_args = ['-fPIE', '-fPIC', '-fstack-protector-all', '-Wall']

if (TORCH_MAJOR == 2 and TORCH_MINOR >= 1) or TORCH_MAJOR > 2 :
    secure_compile_args.append('-std=c++17')

secure_link_args = ['-Wl,-z,now', '-Wl,-z,relro', '-Wl,-z,noexecstack', '-s'@RPATH@]

def get_package_dir():
@GET_PACKAGE_DIR@

def CppExtension(name, sources, *args, **kwargs):
    package_dir = get_package_dir()
    temp_include_dirs = kwargs.get('include_dirs', [])
    temp_include_dirs.append(os.path.join(package_dir, 'torch/include'))
    temp_include_dirs.append(os.path.join(package_dir, 'torch/include/torch/csrc/api/include'))
    kwargs['include_dirs'] = temp_include_dirs

    temp_library_dirs = kwargs.get('library_dirs', [])
    temp_library_dirs.append(os.path.join(package_dir, 'torch/lib'))
    kwargs['library_dirs'] = temp_library_dirs

    libraries = kwargs.get('libraries', [])
    libraries.append('c10')
    libraries.append('torch')
    libraries.append('torch_cpu')
    libraries.append('torch_python')
    kwargs['libraries'] = libraries
    kwargs['language'] = 'c++'
    return Extension(name, sources, *args, **kwargs)


class BuildExtension(build_ext, object):

    def build_extensions(self):
        if self.compiler and '-Wstrict-prototypes' in self.compiler.compiler_so:
            self.compiler.compiler_so.remove('-Wstrict-prototypes')

        if self.compiler and '-g' in self.compiler.compiler_so:
            self.compiler.compiler_so.remove('-g')

        return super(BuildExtension, self).build_extensions()


if "--cpp_ext" in sys.argv:
    cmdclass['build_ext'] = BuildExtension

if "--cpp_ext" in sys.argv:
    sys.argv.remove("--cpp_ext")
    ext_modules.append(
        CppExtension('apex_C',
                     ['csrc/flatten_unflatten.cpp',],
                     extra_compile_args=secure_compile_args,
                     extra_link_args=secure_link_args))

    ext_modules.append(
        CppExtension('change_data_ptr',
                     ['csrc/combine_tensors/change_dataptr.cpp',],
                     extra_compile_args=secure_compile_args,
                     extra_link_args=secure_link_args))

setup(
    name='apex',
    version='0.1-ascend',
    packages=find_packages(exclude=('build',
                                    'csrc',
                                    'include',
                                    'tests',)),
    description='PyTorch Extensions written by NVIDIA',
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
"""

GET_PACKAGE_DIR = """\
    if '--user' in sys.argv:
        package_dir = site.getusersitepackages()
    else:
        py_version = f'{sys.version_info.major}.{sys.version_info.minor}'
        package_dir = f'{sys.prefix}/lib/python{py_version}/site-packages'
    return package_dir
"""

# Upstream drift: same function, reshaped so our torch-location patch no longer finds its anchor.
GET_PACKAGE_DIR_DRIFTED = """\
    py_version = '%d.%d' % sys.version_info[:2]
    return os.path.join(sys.prefix, 'lib', 'python' + py_version, 'site-packages')
"""

BUILD_SH = """\
#!/bin/bash
# fixture of Ascend's scripts/build.sh: it clones NVIDIA apex again on every run (wiping local fixes).
CUR_DIR=$(dirname $(readlink -f $0))
ROOT_DIR=$CUR_DIR/..
APEX_DIR=$ROOT_DIR/apex
PY_VERSION='3.7'
touch "${{APEXKIT_FIXTURE_MARKER:-/tmp/apexkit-fixture-build-sh-ran}}"
cd $ROOT_DIR || exit
git clone {nvidia_url} apex
cd apex
git checkout {pin}
cd ..
cp $ROOT_DIR/patch/npu.patch $APEX_DIR
cd $APEX_DIR || exit
patch -p1 <npu.patch
rm -rf npu.patch
cp -r $ROOT_DIR/src/* $APEX_DIR
cp -r $ROOT_DIR/tests/* $APEX_DIR/tests
cd $APEX_DIR || exit
python"${{PY_VERSION}}" setup.py --cpp_ext bdist_wheel
"""


@dataclass(frozen=True)
class FixtureRepos:
    nvidia_path: Path
    ascend_path: Path
    nvidia_pin: str
    nvidia_head: str

    @property
    def nvidia_url(self) -> str:
        return f"file://{self.nvidia_path}"

    @property
    def ascend_url(self) -> str:
        return f"file://{self.ascend_path}"

    def env(self, cache_dir: Path) -> dict[str, str]:
        return {
            "APEXKIT_ASCEND_APEX_URL": self.ascend_url,
            "APEXKIT_NVIDIA_APEX_URL": self.nvidia_url,
            "APEXKIT_CACHE_DIR": str(cache_dir),
        }


def git(cwd: Path, *args: str) -> str:
    env = dict(os.environ, **GIT_ENV)
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def nvidia_files() -> dict[str, str]:
    return {
        "setup.py": NVIDIA_SETUP,
        "csrc/flatten_unflatten.cpp": C_MODULE.format(name="apex_C", dtype="Float"),
        "apex/__init__.py": "from . import amp\n",
        "apex/amp/__init__.py": "from .frontend import initialize\n",
        "apex/contrib/__init__.py": "",
        "apex/amp/frontend.py": "def initialize(models, optimizers=None, opt_level='O1'):\n    return models, optimizers\n",
        "tests/L0/run_test.py": "print('fixture L0 tests')\n",
        ".gitignore": "build\n",
        ".gitmodules": "",
    }


# NVIDIA apex on CUDA (--backend cuda): a setup.py shaped like upstream master's (ENV_TO_FLAG, has_flag, CUDA_HOME,
# the bare-metal check against torch.version.cuda, version "0.1", install_requires), apex_C from C++ and amp_C from a
# C++ frontend plus one small .cu kernel; --xentropy is a contrib extension (a second .cu). The C++ uses the CPython
# API and cuda_runtime.h, not torch/extension.h, so nvcc takes seconds; CUDAExtension still links torch and cudart.
CUDA_SETUP = """\
import os
import subprocess
import sys

from packaging.version import parse
import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

this_dir = os.path.dirname(os.path.abspath(__file__))
ENV_TO_FLAG = {"APEX_CPP_EXT": "--cpp_ext", "APEX_CUDA_EXT": "--cuda_ext", "APEX_XENTROPY": "--xentropy"}
for env_var, flag in ENV_TO_FLAG.items():
    if os.environ.get(env_var, "0") == "1" and flag not in sys.argv:
        sys.argv.append(flag)


def has_flag(flag, env_var):
    return flag in sys.argv or os.environ.get(env_var, "0") == "1"


def get_cuda_bare_metal_version(cuda_dir):
    raw_output = subprocess.check_output([cuda_dir + "/bin/nvcc", "-V"], universal_newlines=True)
    output = raw_output.split()
    release_idx = output.index("release") + 1
    return raw_output, parse(output[release_idx].split(",")[0])


def check_cuda_torch_binary_vs_bare_metal(cuda_dir):
    raw_output, bare_metal_version = get_cuda_bare_metal_version(cuda_dir)
    if bare_metal_version != parse(torch.version.cuda):
        raise RuntimeError("Cuda extensions are being compiled with a version of Cuda that does not match")


ext_modules = []
if has_flag("--cpp_ext", "APEX_CPP_EXT"):
    if "--cpp_ext" in sys.argv:
        sys.argv.remove("--cpp_ext")
    ext_modules.append(CppExtension("apex_C", ["csrc/flatten_unflatten.cpp"]))

_, bare_metal_version = get_cuda_bare_metal_version(CUDA_HOME)

if has_flag("--cuda_ext", "APEX_CUDA_EXT"):
    if "--cuda_ext" in sys.argv:
        sys.argv.remove("--cuda_ext")
    check_cuda_torch_binary_vs_bare_metal(CUDA_HOME)
    ext_modules.append(
        CUDAExtension(
            name="amp_C",
            sources=["csrc/amp_C_frontend.cpp", "csrc/multi_tensor_scale_kernel.cu"],
            extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3", "--use_fast_math"]},
        )
    )

if has_flag("--xentropy", "APEX_XENTROPY"):
    if "--xentropy" in sys.argv:
        sys.argv.remove("--xentropy")
    ext_modules.append(
        CUDAExtension(
            name="xentropy_cuda",
            sources=["csrc/xentropy_frontend.cpp", "csrc/xentropy_kernel.cu"],
            extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3"]},
        )
    )

setup(
    name="apex",
    version="0.1",
    packages=find_packages(exclude=("build", "csrc", "include", "tests", "dist", "docs", "examples")),
    install_requires=["packaging>20.6"],
    description="PyTorch Extensions written by NVIDIA",
    ext_modules=ext_modules,
    cmdclass={"build_ext": BuildExtension} if ext_modules else {},
)
"""

CUDA_FRONTEND = """\
// Fixture: the Python side of {name}; {launcher} lives in the .cu file.
#include <Python.h>

int {launcher}(int n);

static PyObject* launch(PyObject*, PyObject* args) {{
  int n = 0;
  if (!PyArg_ParseTuple(args, "i", &n)) return nullptr;
  return PyLong_FromLong({launcher}(n));
}}
static PyMethodDef methods[] = {{
  {{"launch", launch, METH_VARARGS, "launch the kernel on n floats; the CUDA error code (0: ran)"}},
  {{nullptr, nullptr, 0, nullptr}}}};
static struct PyModuleDef module_def = {{PyModuleDef_HEAD_INIT, "{name}", nullptr, -1, methods}};
PyMODINIT_FUNC PyInit_{name}(void) {{ return PyModule_Create(&module_def); }}
"""

CUDA_KERNEL = """\
// Fixture kernel of {name}: one small __global__ function, so nvcc embeds SASS (and PTX when asked) per arch.
#include <cuda_runtime.h>

__global__ void {kernel}(float* x, float s, int n) {{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * s{extra};
}}

int {launcher}(int n) {{
  int devices = 0;
  cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) return err == cudaSuccess ? -1 : (int)err;
  float* x = nullptr;
  if ((err = cudaMalloc(&x, n * sizeof(float))) != cudaSuccess) return (int)err;
  {kernel}<<<(n + 255) / 256, 256>>>(x, 2.0f, n);
  err = cudaDeviceSynchronize();
  cudaFree(x);
  return (int)err;
}}
"""


def nvidia_cuda_files() -> dict[str, str]:
    files = nvidia_files()
    files["setup.py"] = CUDA_SETUP
    for name, launcher, kernel, stem in (
        ("amp_C", "multi_tensor_scale", "scale_kernel", "multi_tensor_scale_kernel"),
        ("xentropy_cuda", "xentropy_forward", "xentropy_kernel", "xentropy_kernel"),
    ):
        front = "amp_C_frontend" if name == "amp_C" else "xentropy_frontend"
        files[f"csrc/{front}.cpp"] = CUDA_FRONTEND.format(name=name, launcher=launcher)
        files[f"csrc/{stem}.cu"] = CUDA_KERNEL.format(
            name=name, launcher=launcher, kernel=kernel, extra=""
        )
    files["apex/contrib/xentropy/__init__.py"] = ""
    return files


def make_cuda(base: Path) -> Path:
    """A git repository shaped like upstream NVIDIA apex master for CUDA builds (branch master)."""
    repo = base / "nvidia-apex-cuda"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "master")
    write(repo, nvidia_cuda_files())
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "fixture: NVIDIA apex master with CUDA extensions")
    return repo


def ascend_tree(nvidia: dict[str, str], drifted: bool, bare_rpath: bool) -> dict[str, str]:
    tree = dict(nvidia)
    setup = ASCEND_SETUP.replace(
        "@GET_PACKAGE_DIR@\n", GET_PACKAGE_DIR_DRIFTED if drifted else GET_PACKAGE_DIR
    )
    setup = setup.replace("@RPATH@", ", '-Wl,--disable-new-dtags,--rpath'" if bare_rpath else "")
    tree["setup.py"] = setup
    tree["apex/__init__.py"] = (
        "import torch\nimport torch_npu  # Apex for Ascend needs the NPU runtime\nfrom . import amp\n"
    )
    tree["csrc/flatten_unflatten.cpp"] = C_MODULE.format(name="apex_C", dtype="Half")
    del tree[".gitignore"], tree[".gitmodules"]
    return tree


def make_npu_patch(work: Path, nvidia: dict[str, str], ascend: dict[str, str]) -> str:
    """diff -Nur of the two trees, with the directory names Ascend's npu.patch uses."""
    a, b = work / "apex", work / "apex-develop"
    for root in (a, b):
        subprocess.run(["rm", "-rf", str(root)], check=True)
    write(a, nvidia)
    write(b, ascend)
    proc = subprocess.run(
        ["diff", "-Nur", "--exclude=.git", "apex", "apex-develop"],
        cwd=work,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1, proc.stderr  # 1: differences found
    return proc.stdout


def make(base: Path) -> FixtureRepos:
    base.mkdir(parents=True, exist_ok=True)
    nv = base / "nvidia-apex"
    nv.mkdir()
    git(nv, "init", "-q", "-b", "master")
    files = nvidia_files()
    write(nv, files)
    git(nv, "add", "-A")
    git(nv, "commit", "-q", "-m", "fixture: upstream at the pinned commit")
    pin = git(nv, "rev-parse", "HEAD")
    write(
        nv,
        {
            "README.md": "later upstream work\n",
            "setup.py": NVIDIA_SETUP.replace("version='0.1'", "version='0.2'"),
        },
    )
    git(nv, "add", "-A")
    git(nv, "commit", "-q", "-m", "fixture: upstream moves on after the pin")
    head = git(nv, "rev-parse", "HEAD")

    asc = base / "ascend-apex"
    asc.mkdir()
    git(asc, "init", "-q", "-b", "master")
    work = base / "patch-work"
    work.mkdir()
    common = {
        "src/apex/contrib/combine_tensors/__init__.py": "from .combine_tensors import combine_npu\n",
        "src/apex/contrib/combine_tensors/combine_tensors.py": "def combine_npu(tensors):\n    return tensors\n",
        "src/csrc/combine_tensors/change_dataptr.cpp": CHANGE_DATAPTR,
        "tests/L0/device.py": "DEVICE = 'npu'\n",
        "scripts/build.sh": BUILD_SH.format(nvidia_url=f"file://{nv}", pin=pin),
        "scripts/gen.sh": "#!/bin/bash\n# fixture: generation only (patch + copy)\n",
        "README.md": "Fixture of Ascend apex: bash scripts/build.sh --python=3.8\n",
    }
    branches = [("master", False, True), ("5.0.rc3", False, False), ("drift", True, True)]
    for i, (branch, drifted, bare_rpath) in enumerate(branches):
        if i:
            git(asc, "checkout", "-q", "-b", branch, "master")
        files_b = dict(common)
        files_b["patch/npu.patch"] = make_npu_patch(
            work, files, ascend_tree(files, drifted, bare_rpath)
        )
        write(asc, files_b)
        git(asc, "add", "-A")
        git(asc, "commit", "-q", "--allow-empty", "-m", f"fixture: {branch}")
    git(asc, "checkout", "-q", "master")
    return FixtureRepos(nvidia_path=nv, ascend_path=asc, nvidia_pin=pin, nvidia_head=head)


def shallow_mirror(source: str, dest: Path, *refspecs: str) -> Path:
    """A mirror for an air-gapped site made as docs/building.md says: a bare repository holding only the given
    commits and branches (`<commit>:refs/tags/pin-<commit>`, `<branch>:refs/heads/<branch>`), one deep."""
    git(dest.parent, "init", "-q", "--bare", str(dest))
    git(dest, "fetch", "-q", "--depth", "1", source, *refspecs)
    return dest
