"""Starter templates for new skills (``listTemplates``): each is a valid skill definition."""

from __future__ import annotations

from typing import Any

_ECHO_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string", "description": "What to echo."}},
    "required": ["text"],
}

TEMPLATES: list[dict[str, Any]] = [
    {
        "key": "python-echo",
        "title": "Python: echo a value and write an output file",
        "language": "python",
        "code_template": (
            "import json, pathlib\n"
            "text = {{text}}\n"
            "pathlib.Path('out').mkdir(exist_ok=True)\n"
            "pathlib.Path('out/echo.txt').write_text(text)\n"
            "print(json.dumps({'echo': text}))\n"
        ),
        "input_schema": _ECHO_SCHEMA,
    },
    {
        "key": "python-stdin",
        "title": "Python: read every input as JSON from stdin",
        "language": "python",
        "code_template": (
            "import json, sys\ninputs = json.load(sys.stdin)\nprint(json.dumps(inputs))\n"
        ),
        "input_schema": {"type": "object", "properties": {}},
    },
    {
        "key": "node-echo",
        "title": "Node.js: echo a value and write an output file",
        "language": "node",
        "code_template": (
            "const fs = require('fs');\n"
            "const text = {{text}};\n"
            "fs.mkdirSync('out', { recursive: true });\n"
            "fs.writeFileSync('out/echo.txt', text);\n"
            "console.log(JSON.stringify({ echo: text }));\n"
        ),
        "input_schema": _ECHO_SCHEMA,
    },
]
