"""The Lambda functions' entry points: the modules the template's `Handler` strings name.

Each is a few lines that call into the library (`ratchet.handlers`), which the asset carries
beside them (`ratchet/cdk/bundling.py`). The library is installable without these; they exist
so that what a function runs is named in one folder, apart from the package.
"""
