"""NVIDIA apex's extensions read from its setup.py in both eras, and --cuda-ext checked against them."""

from __future__ import annotations

import pytest

from apexkit.errors import ConfigError
from apexkit.wheel import nvidiaext

# Shaped like upstream master (2026): flags from the environment through ENV_TO_FLAG, read by has_flag().
MASTER = """
import sys, os
ENV_TO_FLAG = {"APEX_CPP_EXT": "--cpp_ext", "APEX_CUDA_EXT": "--cuda_ext", "APEX_XENTROPY": "--xentropy",
               "APEX_FAST_LAYER_NORM": "--fast_layer_norm"}
def has_flag(flag, env_var):
    return flag in sys.argv or os.environ.get(env_var, "0") == "1"
if has_flag("--cpp_ext", "APEX_CPP_EXT"):
    pass
if has_flag("--distributed_adam", "APEX_DISTRIBUTED_ADAM"):
    pass
parallel = None
if "--parallel" in sys.argv:
    parallel = int(sys.argv[sys.argv.index("--parallel") + 1])
"""

# Shaped like 4ef930c (2020): flags on the command line only.
OLD = """
import sys
if "--pyprof" in sys.argv:
    sys.argv.remove("--pyprof")
if "--cpp_ext" in sys.argv or "--cuda_ext" in sys.argv:
    pass
if "--cpp_ext" in sys.argv:
    sys.argv.remove("--cpp_ext")
if "--cuda_ext" in sys.argv:
    sys.argv.remove("--cuda_ext")
if "--fast_multihead_attn" in sys.argv:
    sys.argv.remove("--fast_multihead_attn")
"""


def test_extensions_of_both_eras_core_first():
    assert nvidiaext.available(MASTER) == (
        "cpp_ext",
        "cuda_ext",
        "distributed_adam",
        "fast_layer_norm",
        "xentropy",
    )
    assert nvidiaext.available(OLD) == ("cpp_ext", "cuda_ext", "fast_multihead_attn")


def test_core_by_default_contrib_by_name():
    assert nvidiaext.flags(("core",), MASTER, "master") == ("--cpp_ext", "--cuda_ext")
    assert nvidiaext.flags(("core", "xentropy", "core"), MASTER, "master") == (
        "--cpp_ext",
        "--cuda_ext",
        "--xentropy",
    )
    assert (
        nvidiaext.flags(("core", "fast_multihead_attn"), OLD, "4ef930c")[-1]
        == "--fast_multihead_attn"
    )


def test_an_extension_the_ref_lacks_is_refused_with_those_it_has():
    with pytest.raises(ConfigError) as caught:
        nvidiaext.flags(("core", "fast_multihead_attn"), MASTER, "master")
    assert caught.value.cause == "NVIDIA apex master has no extension 'fast_multihead_attn'"
    assert (
        caught.value.hint == "choose core and any of: distributed_adam, fast_layer_norm, xentropy"
    )


@pytest.mark.parametrize(
    ("setup", "said"),
    [
        ("print('not apex')\n", "reads no --cpp_ext --cuda_ext"),
        ("def broken(:\n", "does not parse"),
        ("#" * (nvidiaext.MAX_SETUP + 1), "limit"),
    ],
)
def test_a_tree_that_is_not_apex_is_refused(setup, said):
    with pytest.raises(ConfigError, match=said):
        nvidiaext.flags(("core",), setup, "master")


@pytest.mark.parametrize("text", ["", " , ", "Core", "x;rm -rf /", "a" * 80])
def test_cuda_ext_names_are_checked(text):
    with pytest.raises(ConfigError) as caught:
        nvidiaext.parse_asked(text)
    assert "\n" not in caught.value.format()


def test_cuda_ext_list_keeps_order_once():
    assert nvidiaext.parse_asked("core, xentropy,core") == ("core", "xentropy")
