"""A local test double of the Hugging Face Hub's *upload* API (no self-hostable server speaks it; docs/design.md §16).

It implements what `HfApi.create_repo`, `upload_folder` (xet pipeline or classic commit, `create_pr`) and
README validation call: repo create, validate-yaml, preupload (every file "regular", so contents arrive base64
in the NDJSON commit), commit, paths-info and PR discussions. It keeps every repo, commit and file in memory so
tests can assert exactly what arrived. Start it with `HubDouble().start()`; point clients at it with
`HF_ENDPOINT` set before `huggingface_hub` is imported, or `HfApi(endpoint=hub.url)`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


@dataclass
class Repo:
    repo_type: str
    repo_id: str
    private: bool
    sdk: str | None = None
    branches: dict[str, dict[str, bytes]] = field(default_factory=lambda: {"main": {}})
    commits: list[dict] = field(default_factory=list)
    prs: list[dict] = field(default_factory=list)


class HubDouble:
    def __init__(self):
        self.repos: dict[tuple[str, str], Repo] = {}
        self.tokens_seen: set[str] = set()
        self.yaml_validated: list[str] = []
        self.app = self._build_app()
        self.server: uvicorn.Server | None = None
        self.url = ""

    # -- helpers for tests
    def repo(self, repo_id: str, repo_type: str = "model") -> Repo:
        return self.repos[(repo_type, repo_id)]

    def files(self, repo_id: str, repo_type: str = "model", branch: str = "main") -> dict[str, bytes]:
        return self.repo(repo_id, repo_type).branches[branch]

    # -- server
    def start(self) -> HubDouble:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning"))
        threading.Thread(target=self.server.run, daemon=True).start()
        for _ in range(200):
            if self.server.started:
                return self
            time.sleep(0.02)
        raise RuntimeError("the Hub test double did not start")

    def stop(self) -> None:
        if self.server:
            self.server.should_exit = True

    def _build_app(self) -> FastAPI:
        app = FastAPI()
        hub = self

        def auth(request: Request) -> JSONResponse | None:
            header = request.headers.get("authorization", "")
            if not header.startswith("Bearer "):
                return JSONResponse({"error": "Invalid credentials in Authorization header"}, status_code=401)
            hub.tokens_seen.add(header[7:])
            return None

        def find(repo_type: str, namespace: str, name: str) -> Repo | None:
            return hub.repos.get((repo_type.rstrip("s"), f"{namespace}/{name}"))

        @app.post("/api/repos/create")
        async def create(request: Request):
            if denied := auth(request):
                return denied
            body = await request.json()
            repo_type = body.get("type") or "model"
            repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
            prefix = "" if repo_type == "model" else f"{repo_type}s/"
            url = f"{hub.url}/{prefix}{repo_id}"
            if (repo_type, repo_id) in hub.repos:
                return JSONResponse({"error": "You already created this repo", "url": url}, status_code=409)
            hub.repos[(repo_type, repo_id)] = Repo(repo_type, repo_id, body.get("visibility", "public") == "private",
                                                   body.get("sdk"))
            return {"url": url, "name": repo_id}

        @app.post("/api/validate-yaml")
        async def validate_yaml(request: Request):
            body = await request.json()
            hub.yaml_validated.append(body["content"])
            if not body["content"].startswith("---"):
                return JSONResponse({"errors": [{"message": "no YAML metadata"}]}, status_code=400)
            return {"errors": [], "warnings": []}

        @app.post("/api/{repo_type}/{namespace}/{name}/preupload/{revision:path}")
        async def preupload(repo_type: str, namespace: str, name: str, revision: str, request: Request):
            if denied := auth(request):
                return denied
            if not find(repo_type, namespace, name):
                return JSONResponse({"error": "Repository not found"}, status_code=404)
            files = (await request.json())["files"]
            return {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None}
                              for f in files]}

        @app.post("/api/{repo_type}/{namespace}/{name}/paths-info/{revision:path}")
        async def paths_info(repo_type: str, namespace: str, name: str, revision: str):
            repo = find(repo_type, namespace, name)
            files = repo.branches.get(revision, {}) if repo else {}
            return [{"type": "file", "path": p, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                    for p, b in files.items()]

        @app.post("/api/{repo_type}/{namespace}/{name}/commit/{revision:path}")
        async def commit(repo_type: str, namespace: str, name: str, revision: str, request: Request):
            if denied := auth(request):
                return denied
            repo = find(repo_type, namespace, name)
            if repo is None:
                return JSONResponse({"error": "Repository not found"}, status_code=404)
            header, added, deleted = {}, {}, []
            for line in (await request.body()).decode().splitlines():
                item = json.loads(line)
                if item["key"] == "header":
                    header = item["value"]
                elif item["key"] == "file":
                    added[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                elif item["key"] == "deletedFile":
                    deleted.append(item["value"]["path"])
                else:
                    return JSONResponse({"error": f"unsupported commit item {item['key']}"}, status_code=400)
            pr_url = None
            if request.query_params.get("create_pr") == "1":
                repo.prs.append({"title": header.get("summary", "")})
                revision = f"refs/pr/{len(repo.prs)}"
            if revision.startswith("refs/pr/"):
                pr_url = f"{hub.url}/{repo.repo_id}/discussions/{revision.rsplit('/', 1)[1]}"
            branch = repo.branches.setdefault(revision, dict(repo.branches["main"]))
            for path in deleted:
                branch.pop(path, None)
            branch.update(added)
            oid = hashlib.sha1(json.dumps(sorted(branch)).encode() + str(len(repo.commits)).encode()).hexdigest()
            repo.commits.append({"revision": revision, "summary": header.get("summary"),
                                 "description": header.get("description", ""), "files": sorted(added),
                                 "deleted": deleted, "oid": oid})
            return {"commitUrl": f"{hub.url}/{repo.repo_id}/commit/{oid}", "commitOid": oid,
                    "pullRequestUrl": pr_url}

        @app.post("/api/{repo_type}/{namespace}/{name}/discussions")
        async def open_pr(repo_type: str, namespace: str, name: str, request: Request):
            if denied := auth(request):
                return denied
            repo = find(repo_type, namespace, name)
            body = await request.json()
            repo.prs.append({"title": body["title"], "description": body.get("description", "")})
            return {"num": len(repo.prs)}

        @app.get("/api/{repo_type}/{namespace}/{name}/discussions/{num}")
        async def pr_details(repo_type: str, namespace: str, name: str, num: int):
            repo = find(repo_type, namespace, name)
            return {"title": repo.prs[num - 1]["title"], "num": num, "author": {"name": "tester"},
                    "createdAt": "2026-01-01T00:00:00.000Z", "status": "draft",
                    "repo": {"name": repo.repo_id, "type": repo.repo_type}, "isPullRequest": True,
                    "events": [], "changes": {"base": "refs/heads/main"}, "filesWithConflicts": []}

        return app
