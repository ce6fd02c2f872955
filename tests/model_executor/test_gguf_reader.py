"""The GGUF reader parses through a plain ndarray view of the file's memory map: it must give what gguf's own
``GGUFReader`` gives, field by field and tensor by tensor, for the default model's file."""

from __future__ import annotations

import numpy as np
from gguf import GGUFReader

from attnserve.model_executor.loader import default_model_path
from attnserve.model_executor.weights import gguf_reader


def test_reader_matches_gguf_reader_on_the_default_model():
    path = default_model_path()
    ours, theirs = gguf_reader(path), GGUFReader(path)
    assert type(ours.data) is np.ndarray and not ours.data.flags.writeable
    assert list(ours.fields) == list(theirs.fields)
    for name, field in theirs.fields.items():
        assert ours.fields[name].contents() == field.contents(), name
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert a.tensor_type == b.tensor_type and a.shape.tolist() == b.shape.tolist(), a.name
        assert np.array_equal(a.data, b.data), a.name
