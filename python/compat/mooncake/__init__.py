# SPDX-License-Identifier: Apache-2.0
"""A `mooncake` package whose `mooncake.engine.TransferEngine` runs on xpyd's transfer engine (see engine.py).
Put the directory holding it first on PYTHONPATH to use it instead of Mooncake's own wheel."""
