"""The built-in models rebuilt on the public API (``cosparse.EmbeddingBagCollection``,
``cosparse.Batch``), each a ``model.factory``: ``cosparse.models.dlrm:build``,
``cosparse.models.deepfm:build``, ``cosparse.models.dcn:build``, ``cosparse.models.din:build``."""
