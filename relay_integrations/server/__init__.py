"""``relaygen serve``: the relay as an OpenAI-compatible server (``relay-integrations[server]``).

Point any OpenAI client at it by changing the base URL::

    relaygen serve --large-url http://gpu-a:8000/v1 --large-model Qwen/Qwen3-32B \\
                   --small-url http://gpu-b:8000/v1 --small-model Qwen/Qwen3-1.7B \\
                   --cues calibration/cues.json --port 9000

    client = openai.OpenAI(base_url="http://localhost:9000/v1", api_key="...")
    client.chat.completions.create(model="Qwen/Qwen3-32B", messages=[...], stream=True)
"""

try:
    import prometheus_client  # noqa: F401
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as missing:
    raise ImportError(
        f"relay_integrations.server needs the server extra ({missing.name} is missing): "
        "pip install 'relay-integrations[server]'",
        name=missing.name,
    ) from missing

from .app import RelayServer
from .settings import ServerSettings

__all__ = ["RelayServer", "ServerSettings"]
