"""Saved artefacts: a directory of safetensors tensors and a JSON manifest that says what made them.

- :mod:`geograph.artefacts.format`: the directory, the manifest and its format version, the
  atomic write and the memory-mapped read of the tensors (the ``safetensors`` library).
- :mod:`geograph.artefacts.identity`: the encoder's identity and the corpus fingerprint a manifest
  records, and the checks that refuse another encoder or corpus (:class:`ArtefactMismatch`).
- :mod:`geograph.artefacts.saved_graphs` (and :mod:`~geograph.artefacts.former_graphs`, the
  former ``torch.save`` format), :mod:`geograph.artefacts.saved_dense`: what
  :class:`~geograph.CorpusGraph`, :class:`~geograph.G3Graph` and
  :class:`~geograph.retrievers.DenseRetriever` save and how they are read back; their
  ``save_pretrained`` / ``from_pretrained`` call them.

See the guide's page on saved artefacts (``docs/guide/artefacts.md``).
"""

from geograph.artefacts.format import (
    FORMAT_VERSION,
    MANIFEST,
    TENSORS,
    Artefact,
    read_artefact,
    resolve_source,
    write_artefact,
)
from geograph.artefacts.identity import (
    ArtefactMismatch,
    CorpusFingerprint,
    EncoderIdentity,
    as_identity,
    check_corpus,
    check_encoder,
    corpus_fingerprint,
)

__all__ = ["FORMAT_VERSION", "MANIFEST", "TENSORS", "Artefact", "read_artefact", "resolve_source", "write_artefact"]
__all__ += ["ArtefactMismatch", "CorpusFingerprint", "EncoderIdentity", "as_identity", "corpus_fingerprint"]
__all__ += ["check_corpus", "check_encoder"]
