"""CPU test setup: Triton's interpreter and a private kernel cache, set before tritune is imported."""
import os
import tempfile

os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("TRITUNE_CACHE_DIR", tempfile.mkdtemp(prefix="tritune-test-"))
os.environ["TRITUNE_DB"] = os.path.join(os.environ["TRITUNE_CACHE_DIR"], "default.db")
