"""``gshare.Client``: the Python API of a running ``gshare serve`` (the CLI uses it).

    from gshare import Client
    c = Client()                                  # http://127.0.0.1:8080, token from ~/.gshare
    c.deploy("examples/mlp.yaml")                 # a path, YAML text, a mapping or a FunctionSpec
    c.invoke("mlp", [0.1] * 64)                   # JSON in, JSON out (bytes in → bytes out)
    c.infer("mlp", [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [...]}])
    c.infer("mlp", [{"name": "input", "data": np.zeros((1, 64), np.float32)}])  # numpy too
    c.list(); c.logs("mlp"); c.delete("mlp")

The control API (``/system/...``) needs the server's bearer token: ``token=`` or else the
``token`` file of the state directory (``state_dir=``, ``$GSHARE_STATE``, ``~/.gshare``);
invocation does not. Every failure raises ``ClientError`` with a one-line message naming the
problem (the server's own message for HTTP errors) and ``status`` (the HTTP code, or None when
the server could not be reached). Answers are the server's JSON documents as decoded
(``dict[str, Any]``: the caller reads them as it needs).
"""

from __future__ import annotations

import builtins
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from gshare.runtime.control.state import read_token, resolve_state_dir

if TYPE_CHECKING:
    from gshare.spec import FunctionSpec

DEFAULT_URL = "http://127.0.0.1:8080"


class ClientError(Exception):
    """A failed call; ``status`` is the HTTP code (None: no answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _message(r: httpx.Response) -> str:
    try:
        doc = r.json()
        if isinstance(doc, dict) and "error" in doc:
            return str(doc["error"])
        if isinstance(doc, dict) and "detail" in doc:
            return str(doc["detail"])
    except ValueError:
        pass
    text = r.text.strip().splitlines()
    return text[0] if text else r.reason_phrase


_NUMPY_DATATYPES = {
    "float16": "FP16", "float32": "FP32", "float64": "FP64", "int8": "INT8", "int16": "INT16",
    "int32": "INT32", "int64": "INT64", "uint8": "UINT8", "uint16": "UINT16",
    "uint32": "UINT32", "uint64": "UINT64", "bool": "BOOL",
}  # fmt: skip
"""numpy dtype name -> the Open Inference Protocol's datatype."""


def _tensor_json(t: Mapping[str, object]) -> dict[str, object]:
    """An OIP input with its ``data`` made JSON: an array's ``tolist()``, and the array's
    shape and datatype where the input does not give them (``ClientError`` for a dtype the
    protocol has no name for)."""
    out = dict(t)
    data = out.get("data")
    if data is None or not hasattr(data, "tolist"):
        return out
    shape, dtype = getattr(data, "shape", None), getattr(data, "dtype", None)
    if "shape" not in out and shape is not None:
        out["shape"] = [int(d) for d in shape]
    if "datatype" not in out and dtype is not None:
        kind = str(dtype)
        if kind not in _NUMPY_DATATYPES:
            raise ClientError(
                f"input {out.get('name')!r}: numpy dtype {kind} has no Open Inference Protocol "
                f"datatype (use one of {', '.join(sorted(_NUMPY_DATATYPES))})"
            )
        out["datatype"] = _NUMPY_DATATYPES[kind]
    flat = data.reshape(-1) if hasattr(data, "reshape") else data
    out["data"] = flat.tolist()
    return out


class Client:
    """A synchronous client of one server (see the module doc)."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        state_dir: str | os.PathLike[str] | None = None,
        timeout_s: float = 300.0,
    ) -> None:
        self.url = (url or os.environ.get("GSHARE_URL") or DEFAULT_URL).rstrip("/")
        try:
            parsed = httpx.URL(self.url)
        except (httpx.InvalidURL, TypeError, ValueError) as e:
            raise ClientError(f"{self.url!r} is not a valid server URL ({e})") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ClientError(
                f"{self.url!r} is not a valid server URL: expected http://HOST[:PORT] or https://..."
            )
        self._token = token or os.environ.get("GSHARE_TOKEN") or None
        self._state_dir = state_dir
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------------------

    def _auth(self) -> dict[str, str]:
        token = self._token or read_token(resolve_state_dir(self._state_dir))
        if not token:
            where = resolve_state_dir(self._state_dir)
            raise ClientError(
                "no control-API token: give the token (Client(token=...); the CLI's --token or "
                "$GSHARE_TOKEN) or the server's state directory (Client(state_dir=...); the "
                f"CLI's --state or $GSHARE_STATE); there is no token in {where}"
            )
        return {"authorization": f"Bearer {token}"}

    def _request(
        self,
        method: str,
        path: str,
        *,
        auth: bool,
        content: str | bytes | None = None,
        json_body: object = None,
        params: Mapping[str, str | int] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        headers = dict(headers or {})
        if auth:
            headers.update(self._auth())
        try:
            r = self._http.request(
                method, path, headers=headers, content=content, json=json_body, params=params
            )
        except httpx.ConnectError as e:
            raise ClientError(
                f"cannot reach the gshare server at {self.url} ({e}); is `gshare serve` running?"
            ) from None
        except httpx.TimeoutException:
            raise ClientError(f"the gshare server at {self.url} did not answer in time") from None
        except httpx.HTTPError as e:
            raise ClientError(f"request to {self.url}{path} failed: {e}") from None
        if r.status_code >= 400:
            raise ClientError(f"{_message(r)} (HTTP {r.status_code})", r.status_code)
        return r

    # -- functions --------------------------------------------------------------------------------

    def deploy(
        self,
        spec: FunctionSpec | Mapping[str, object] | str | os.PathLike[str],
        *,
        update: bool = True,
    ) -> dict[str, Any]:
        """Deploy a function (create it, or with ``update`` replace an existing one). ``spec``:
        a ``FunctionSpec``, a mapping, a YAML file path or YAML text; it is validated here first
        (``SpecError`` → ``ClientError``), relative paths resolved against the file's folder."""
        from gshare.spec import SpecError, load_function_spec  # lazy: pydantic, for deploy only

        try:
            fs = load_function_spec(Path(spec) if isinstance(spec, os.PathLike) else spec)
        except SpecError as e:
            raise ClientError(str(e)) from None
        body = json.dumps(fs.model_dump(mode="json"))
        headers = {"content-type": "application/json"}
        try:
            r = self._request("POST", "/system/functions", auth=True, content=body, headers=headers)
        except ClientError as e:
            if e.status != 409 or not update:
                raise
            r = self._request("PUT", "/system/functions", auth=True, content=body, headers=headers)
        out: dict[str, Any] = r.json()
        return out

    def list(self) -> builtins.list[dict[str, Any]]:
        out: builtins.list[dict[str, Any]] = self._request(
            "GET", "/system/functions", auth=True
        ).json()
        return out

    def get(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = self._request("GET", f"/system/function/{name}", auth=True).json()
        return out

    def delete(self, name: str) -> None:
        self._request(
            "DELETE",
            "/system/functions",
            auth=True,
            content=json.dumps({"functionName": name}),
            headers={"content-type": "application/json"},
        )

    # -- workflows ------------------------------------------------------------------------------

    def deploy_workflow(
        self, spec: str | os.PathLike[str] | bytes, *, update: bool = True
    ) -> dict[str, Any]:
        """Deploy (or with ``update`` replace) a workflow from a YAML file path or YAML bytes;
        the server checks it against the deployed functions."""
        body = Path(spec).read_bytes() if isinstance(spec, str | os.PathLike) else spec
        headers = {"content-type": "application/yaml"}
        try:
            r = self._request("POST", "/system/workflows", auth=True, content=body, headers=headers)
        except ClientError as e:
            if e.status != 409 or not update:
                raise
            r = self._request("PUT", "/system/workflows", auth=True, content=body, headers=headers)
        out: dict[str, Any] = r.json()
        return out

    def list_workflows(self) -> builtins.list[dict[str, Any]]:
        out: builtins.list[dict[str, Any]] = self._request(
            "GET", "/system/workflows", auth=True
        ).json()
        return out

    def delete_workflow(self, name: str) -> None:
        self._request("DELETE", f"/system/workflows/{name}", auth=True)

    def invoke_workflow_raw(
        self, name: str, body: bytes, content_type: str = "application/octet-stream"
    ) -> httpx.Response:
        """POST the body to ``/workflow/{name}``; the raw response (``ClientError`` on 4xx/5xx)."""
        return self._request(
            "POST", f"/workflow/{name}", auth=False, content=body,
            headers={"content-type": content_type},
        )  # fmt: skip

    def invoke_workflow(self, name: str, data: object = None) -> Any:
        """Run a workflow with JSON ``data`` (or raw bytes); the last stage's answer."""
        if isinstance(data, bytes | bytearray):
            r = self.invoke_workflow_raw(name, bytes(data))
        else:
            r = self.invoke_workflow_raw(name, json.dumps(data).encode(), "application/json")
        if r.headers.get("content-type", "").startswith("application/json"):
            return r.json()
        return r.content

    def instance_stats(self, name: str, instance_id: str) -> dict[str, Any]:
        """One instance's own counters (``/system/function/{name}/instances/{id}/stats``)."""
        out: dict[str, Any] = self._request(
            "GET", f"/system/function/{name}/instances/{instance_id}/stats", auth=True
        ).json()
        return out

    def logs(self, name: str, tail: int = 100) -> builtins.list[str]:
        out: builtins.list[str] = self._request(
            "GET", "/system/logs", auth=True, params={"name": name, "tail": tail}
        ).json()["lines"]
        return out

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = self._request("GET", "/system/info", auth=True).json()
        return out

    # -- invocation -------------------------------------------------------------------------------

    def invoke_raw(
        self, name: str, body: bytes, content_type: str = "application/octet-stream"
    ) -> httpx.Response:
        """POST the body to ``/function/{name}``; the raw response (``ClientError`` on 4xx/5xx)."""
        return self._request(
            "POST",
            f"/function/{name}",
            auth=False,
            content=body,
            headers={"content-type": content_type},
        )

    def invoke(self, name: str, data: object = None) -> Any:
        """Invoke with JSON (any JSON-serialisable ``data``) or raw bytes; returns the decoded
        JSON answer, or bytes when the function answered bytes."""
        if isinstance(data, bytes | bytearray):
            r = self.invoke_raw(name, bytes(data))
        else:
            r = self.invoke_raw(name, json.dumps(data).encode(), "application/json")
        if r.headers.get("content-type", "").startswith("application/json"):
            return r.json()
        return r.content

    def infer(
        self, name: str, inputs: Sequence[Mapping[str, object]], request_id: str | None = None
    ) -> dict[str, Any]:
        """Open Inference Protocol v2 ``infer``: ``inputs`` are ``{name, shape, datatype,
        data}``; ``data`` may be a numpy array (or anything with ``tolist``), whose shape and
        datatype fill in ``shape`` and ``datatype`` when they are not given."""
        body: dict[str, object] = {"inputs": [_tensor_json(t) for t in inputs]}
        if request_id is not None:
            body["id"] = request_id
        out: dict[str, Any] = self._request(
            "POST", f"/v2/models/{name}/infer", auth=False, json_body=body
        ).json()
        return out

    # -- profiling --------------------------------------------------------------------------------

    def start_profile(self, name: str, **grid: object) -> dict[str, Any]:
        """Start the live profiler (``sm_pct``, ``quota_pct``, ``batch``: lists; ``trial_s``)."""
        body = {k: v for k, v in grid.items() if v is not None}
        out: dict[str, Any] = self._request(
            "POST", f"/system/profile/{name}", auth=True, json_body=body
        ).json()
        return out

    def profile_status(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = self._request("GET", f"/system/profile/{name}", auth=True).json()
        return out


__all__ = ["DEFAULT_URL", "Client", "ClientError"]
