"""xgrammar on the CPU without torch, for the mask cross-check and the grammar bench.

xgrammar's Python package imports torch at module load (matcher.py, testing.py, contrib/hf.py)
only to name tensor types and allocate bitmasks; its masks are computed in C++ and
`GrammarMatcher.fill_next_token_bitmask` takes any int32 DLPack array. PyPI's torch brings
several GB of CUDA wheels, so the tests install xgrammar without it
(tests/requirements-no-deps.txt) and import it here with a placeholder `torch` module that
names those types; every bitmask is a numpy array. With a real torch installed, it is used.
"""

import sys
import types

import numpy as np


class _PlaceholderTorch(types.ModuleType):
    """Only the names xgrammar touches while importing; anything else says torch is missing."""

    class Tensor:
        pass

    LongTensor = FloatTensor = Tensor
    int32 = "int32"

    @staticmethod
    def tensor(*args, **kwargs):
        return None

    def __getattr__(self, name):
        raise AttributeError(f"torch.{name}: torch is not installed (tests/testing/xgrammar_cpu.py)")


def import_xgrammar():
    """Returns the xgrammar module; raises ImportError when xgrammar is not installed."""
    if "xgrammar" in sys.modules:
        return sys.modules["xgrammar"]
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
    if have_torch:
        import xgrammar
        return xgrammar
    # These check for torch themselves: import them first, so they see it missing.
    import transformers  # noqa: F401
    import tvm_ffi  # noqa: F401
    from transformers import LogitsProcessor, PreTrainedTokenizerBase, PreTrainedTokenizerFast  # noqa: F401
    placeholder = _PlaceholderTorch("torch")
    sys.modules["torch"] = placeholder
    try:
        import xgrammar
    finally:
        if sys.modules.get("torch") is placeholder:
            del sys.modules["torch"]
    return xgrammar


def allocate_bitmask(vocab_size):
    """One row of xgrammar's bitmask layout: int32 words, bit i of word i/32 is token i."""
    return np.zeros((1, (vocab_size + 31) // 32), dtype=np.int32)


def bitmask_to_bools(bitmask, vocab_size):
    """The allowed tokens of one bitmask row as a bool array of length vocab_size."""
    row = np.ascontiguousarray(bitmask.reshape(-1)).view(np.uint8)
    return np.unpackbits(row, bitorder="little")[:vocab_size].astype(bool)
