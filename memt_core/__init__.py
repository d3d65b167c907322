"""MemT serve: serving, client and in-process API for MemT latent-memory models.

Subpackages: ``memory`` (the algorithm), ``models`` (backbone + memory), ``protocol`` (memt-http-v1
state machine), ``engine`` (runs queries and commits), ``server`` (HTTP), ``client`` (native client).
Importing this package imports neither torch nor transformers.
"""

__version__ = "0.1.0"
