"""The SQL an engineer runs (``fleetlog query --file``) and the lifecycle rules (``policies/``).

A package only so that an installed wheel carries these files: ``ingest.config.DEFAULT_QUERIES_DIR``
finds them through ``importlib.resources``, from any directory.
"""
