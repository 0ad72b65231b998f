"""The built-in models rebuilt on the public API (``cosparse.EmbeddingBagCollection``,
``cosparse.Batch``), each a ``model.factory``: ``cosparse.models.dlrm:build``,
``cosparse.models.deepfm:build``, ``cosparse.models.dcn:build``, ``cosparse.models.din:build``,
and the multi-task ``cosparse.models.mmoe:build``, ``cosparse.models.ple:build`` and
``cosparse.models.esmm:build`` (one output per task of the objective)."""
