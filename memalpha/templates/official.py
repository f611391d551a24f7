"""The official prompt texts, read from a local clone of the official code (memalpha/commands/prompt_files.py
writes them as a template file: `memalpha prompts import PATH`).

The published Mem-α checkpoint was trained on the official code's prompt texts, so it is
evaluated with them (docs/official_compatibility.md, difference 4). memalpha ships none of those
texts: this module reads them from a clone of the official repository the user provides, with
:mod:`ast` (string constants and f-strings found by file, class, function and variable names;
the official code is never imported or run) and ``yaml.safe_load`` for its YAML config, converts
the official placeholders to memalpha's and writes a file :func:`memalpha.templates.loader.load_templates`
reads. Nothing is downloaded.

Where each template comes from (paths inside the clone):

========================== ==========================================================================
template                   official source
========================== ==========================================================================
memorise_system            ``memory.py``, ``Memory.render_system_prompt``: the memorising f-string,
                           with the three memory-type lines put in and ``{memory_view}`` for the
                           memory state; ``{tool_block}`` follows after an empty line, where
                           Qwen-Agent appends its function-call block to the system message
memorise_user,             ``config/prompts_wrt_datasource.yaml``, ``unified_prompt``: ``{context}``
response_limit_note        becomes ``{chunk}``; its last paragraph, the one with ``{max_new_tokens}``,
                           becomes the limit note (``{limit}``)
view_recent_header         ``Memory.render_system_prompt``: the semantic list's header f-string
view_empty_core            ``Memory.render_system_prompt`` shows the core verbatim: empty text
view_empty_list,           ``memory.py``, ``Memory._block``: its one fixed text (the list body
view_hidden_list           without entries; shown for k = 0 too)
answer_system(_no_core)    ``memory_server.py``, ``MemoryProcessor.construct_system_prompt``: with
                           the memory-structure lines (the core line only when the core is set)
answer_view_empty_list     ``MemoryProcessor._format_memory_block``: the body of an empty list
answer_user                ``memalpha/llm_agent/generation.py``: the text joining ``query_prompt``
                           and the question
content_judge_*            ``MemoryProcessor._get_analysis_prompt``: the rules, per memory type
content_judge_system       ``{rules}``: the official judge's system message is the kind's rules alone
content_judge              ``MemoryProcessor.analyze_memory_content``: the user f-string (the entry)
content_judge_retry        ``MemoryProcessor.analyze_memory_content``: the text its retry loop appends
                           (``+=``) to the user message's ``content`` after a malformed judgement
answer_judge               ``long_context_eval.py``, ``LongContextEvaluator._compute_score``: the
                           ``template`` with three ``{}`` (question, rubric, response)
tool_block_qwen            only with ``--qwen-agent DIR``: the memory tools of ``functions.py``
                           written into the function-call block of the Qwen-Agent install in
                           ``DIR`` (:func:`qwen_tool_block`), a fixed text
========================== ==========================================================================

The ``compact_*`` templates get the same texts as the full ones (the official code has one
profile). The tool blocks stay memalpha's unless ``--qwen-agent DIR`` names a local Qwen-Agent
install (a package outside the official repository; the official code pins 0.0.29): then
``tool_block_qwen`` is the official block, listing the official tools' own descriptions.
"""

from __future__ import annotations

import ast
import json
import string
from pathlib import Path

import yaml

from memalpha.templates.loader import TEMPLATE_NAMES, check_templates, default_templates

REQUIRED_FILES = (
    "memory.py",
    "memory_server.py",
    "config/prompts_wrt_datasource.yaml",
    "memalpha/llm_agent/generation.py",
    "long_context_eval.py",
)
"""Files a clone of the official repository has, each read by the importer."""


class OfficialTextError(ValueError):
    """A one-line reason why the texts could not be imported."""


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


class _Source:
    """One parsed Python file of the clone, searched by class and function names."""

    def __init__(self, root: Path, relative: str) -> None:
        self.where = relative
        try:
            self.tree = ast.parse((root / relative).read_text(encoding="utf-8"), filename=relative)
        except (OSError, SyntaxError, UnicodeDecodeError) as exc:
            raise OfficialTextError(f"{relative}: cannot be read as Python ({type(exc).__name__})") from None

    def function(self, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
        """The function ``Class.method`` (or a module-level ``name``)."""
        *owner, name = qualname.split(".")
        scope: list[ast.stmt] = self.tree.body
        for part in owner:
            found = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == part]
            if not found:
                raise OfficialTextError(f"{self.where}: no class {part}")
            scope = found[0].body
        for node in scope:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return node
        raise OfficialTextError(f"{self.where}: no function {qualname}")


def _names(node: ast.JoinedStr) -> set[str]:
    return {ast.unparse(v.value) for v in node.values if isinstance(v, ast.FormattedValue)}


def _fstring(node: ast.JoinedStr, replace: dict[str, str], where: str) -> str:
    """The f-string ``node`` as a template: fixed text escaped, each ``{expr}`` replaced by
    ``replace[expr]`` (already template text)."""
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(_escape(value.value))
        elif isinstance(value, ast.FormattedValue):
            expr = ast.unparse(value.value)
            if expr not in replace or value.format_spec is not None or value.conversion != -1:
                raise OfficialTextError(f"{where}: unexpected field {{{expr}}} in the official text")
            parts.append(replace[expr])
    return "".join(parts)


def _find_fstring(function: ast.AST, names: set[str], where: str) -> ast.JoinedStr:
    """The one f-string in ``function`` whose fields are exactly ``names``."""
    found = [n for n in ast.walk(function) if isinstance(n, ast.JoinedStr) and _names(n) == names]
    if len(found) != 1:
        raise OfficialTextError(
            f"{where}: expected one f-string with the fields {sorted(names)}, found {len(found)}"
        )
    return found[0]


def _strings(function: ast.AST) -> list[str]:
    """Every plain string constant in ``function`` (docstrings included), in source order."""
    return [n.value for n in ast.walk(function) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _one(items: list[str], where: str, what: str) -> str:
    distinct = list(dict.fromkeys(items))
    if len(distinct) != 1:
        raise OfficialTextError(f"{where}: expected one {what}, found {len(distinct)}")
    return distinct[0]


def _memory_texts(memory: _Source) -> dict[str, str]:
    where = f"{memory.where}: Memory.render_system_prompt"
    render = memory.function("Memory.render_system_prompt")
    lines = [s for s in _strings(render) if s.startswith("* ")]
    kinds = []
    for kind in ("core_memory", "semantic_memory", "episodic_memory"):
        kinds.append(
            _one([s for s in lines if s.startswith(f"* {kind}")], where, f"'* {kind}' memory-type line")
        )
    system = _find_fstring(render, {"instructions_text", "memory_state_text"}, where)
    memorise_system = _fstring(
        system, {"instructions_text": _escape("\n".join(kinds)), "memory_state_text": "{memory_view}"}, where
    )
    header = _find_fstring(
        render, {"visible_semantic", "total_semantic", "self._block(lines=semantic_items)"}, where
    )
    text = _fstring(header, {"visible_semantic": "{shown}", "total_semantic": "{total}",
                             "self._block(lines=semantic_items)": ""}, where)
    if not text.startswith("<semantic_memory> ") or "\n" not in text:
        raise OfficialTextError(f"{where}: the semantic list's header f-string has an unexpected layout")
    _find_fstring(render, {"self.core"}, where)  # the core is shown verbatim, so an empty core is empty text
    block = memory.function("Memory._block")
    fixed = [v.value for n in ast.walk(block) if isinstance(n, ast.JoinedStr) and not _names(n)
             for v in n.values if isinstance(v, ast.Constant)]
    empty = _one(fixed, f"{memory.where}: Memory._block", "fixed text for an empty list")
    return {
        "memorise_system": memorise_system + "\n\n{tool_block}",
        "view_recent_header": text[len("<semantic_memory> "):text.index("\n")],
        "view_empty_core": "",
        "view_empty_list": _escape(empty),
        "view_hidden_list": _escape(empty),
    }


def _server_texts(server: _Source) -> dict[str, str]:
    where = f"{server.where}: MemoryProcessor.construct_system_prompt"
    construct = server.function("MemoryProcessor.construct_system_prompt")
    items: dict[str, str] = {}
    for node in ast.walk(construct):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and ast.unparse(node.func.value) == "memory_structure_items"
        ):
            for arg in node.args:
                for item in (arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg]):
                    if isinstance(item, ast.Constant) and isinstance(item.value, str):
                        items[node.func.attr + ":" + item.value] = item.value
    core = [v for k, v in items.items() if k.startswith("append:")]
    rest = [v for k, v in items.items() if k.startswith("extend:")]
    if len(core) != 1 or len(rest) != 2:
        raise OfficialTextError(f"{where}: expected one core and two list lines of memory_structure_items")
    system = _find_fstring(construct, {"memory_structure", "memory_content"}, where)
    with_core = _fstring(
        system, {"memory_structure": _escape("\n".join(core + rest)), "memory_content": "{memory}"}, where
    )
    no_core = _fstring(
        system, {"memory_structure": _escape("\n".join(rest)), "memory_content": "{memory}"}, where
    )
    where_block = f"{server.where}: MemoryProcessor._format_memory_block"
    bodies = [
        _fstring(n, {"block_name": "TAG"}, where_block).split("\n")
        for n in ast.walk(server.function("MemoryProcessor._format_memory_block"))
        if isinstance(n, ast.JoinedStr) and _names(n) == {"block_name"}
    ]
    body = _one(
        [b[1] for b in bodies if len(b) == 3 and b[1]], where_block, "f-string of an empty list's block"
    )
    where_judge = f"{server.where}: MemoryProcessor._get_analysis_prompt"
    rules: dict[str, str] = {}
    for node in ast.walk(server.function("MemoryProcessor._get_analysis_prompt")):
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and isinstance(node.test.comparators[0], ast.Constant)
        ):
            kind = node.test.comparators[0].value
            returned = [
                s.value for s in node.body if isinstance(s, ast.Return) and isinstance(s.value, ast.Constant)
            ]
            if kind in ("core", "semantic", "episodic") and returned:
                rules[kind] = returned[0].value
    missing = [k for k in ("core", "semantic", "episodic") if k not in rules]
    if missing:
        raise OfficialTextError(f"{where_judge}: no analysis prompt for memory type(s) {missing}")
    where_user = f"{server.where}: MemoryProcessor.analyze_memory_content"
    analyze = server.function("MemoryProcessor.analyze_memory_content")
    user = _find_fstring(analyze, {"memory_type", "content"}, where_user)
    return {
        "answer_system": with_core,
        "answer_system_no_core": no_core,
        "answer_view_empty_list": body,
        "content_judge_system": "{rules}",  # the rules alone are the judge's system message
        "content_judge": _fstring(user, {"memory_type": "{kind}", "content": "{content}"}, where_user),
        "content_judge_retry": _escape(_retry_text(analyze, where_user)),
        **{f"content_judge_{kind}": _escape(text) for kind, text in rules.items()},
    }


def _retry_text(analyze: ast.AST, where: str) -> str:
    """The text the official per-call judge appends to its user message before asking again:
    the string of ``messages[...]["content"] += "..."`` in ``analyze_memory_content``."""
    found = [n.value.value for n in ast.walk(analyze)
             if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add)
             and isinstance(n.target, ast.Subscript) and isinstance(n.target.slice, ast.Constant)
             and n.target.slice.value == "content"
             and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)]
    return _one(found, where, "text appended to the user message's content on a retry")


def _instruction_join(generation: _Source) -> str:
    """The text the official training code puts between a source's ``query_prompt`` and the question."""
    found = []
    for node in ast.walk(generation.tree):
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Add)
            and isinstance(node.right, ast.Constant)
            and isinstance(node.right.value, str)
            and isinstance(node.left, ast.Subscript)
            and isinstance(node.left.slice, ast.Constant)
            and node.left.slice.value == "query_prompt"
        ):
            found.append(node.right.value)
    return (
        "{instruction}"
        + _escape(_one(found, generation.where, "text joining query_prompt and the question"))
        + "{question}"
    )


def _answer_judge(evaluator: _Source) -> str:
    where = f"{evaluator.where}: LongContextEvaluator._compute_score"
    found = []
    for node in ast.walk(evaluator.function("LongContextEvaluator._compute_score")):
        if (isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["template"]
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            found.append(node.value.value)
    text = _one(found, where, "judge `template`")
    problem = OfficialTextError(
        f"{where}: the judge template must have three {{}} fields (question, rubric, response)"
    )
    try:  # the official code fills it with str.format(question, rubric, response)
        parsed = list(string.Formatter().parse(text))
    except ValueError:
        raise problem from None
    fields = [name for _, name, _, _ in parsed if name is not None]
    if fields != ["", "", ""]:
        raise problem
    ours = iter(("{question}", "{rubric}", "{response}"))
    return "".join(
        _escape(literal) + (next(ours) if name is not None else "") for literal, name, _, _ in parsed
    )


def _user_texts(root: Path) -> dict[str, str]:
    relative = "config/prompts_wrt_datasource.yaml"
    try:
        config = yaml.safe_load((root / relative).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        raise OfficialTextError(f"{relative}: cannot be read as YAML ({type(exc).__name__})") from None
    prompt = config.get("unified_prompt") if isinstance(config, dict) else None
    if not isinstance(prompt, str):
        raise OfficialTextError(f"{relative}: no unified_prompt text")
    *body, last = prompt.split("\n\n")
    if "{max_new_tokens}" not in last or "{context}" not in "\n\n".join(body):
        raise OfficialTextError(
            f"{relative}: unified_prompt must hold {{context}} "
            "and end with a paragraph holding {max_new_tokens}"
        )

    def convert(text: str, official: str, ours: str) -> str:
        """An official ``str.format`` text with one field renamed (its other braces kept as they render)."""
        try:
            plain = text.replace(official, "\0").format()  # any other field fails here
        except (KeyError, IndexError, ValueError):
            raise OfficialTextError(
                f"{relative}: unified_prompt has fields other than {{context}} and {{max_new_tokens}}"
            ) from None
        return _escape(plain).replace("\0", ours)

    return {
        "memorise_user": convert("\n\n".join(body), "{context}", "{chunk}") + "{limit_note}",
        "response_limit_note": "\n\n" + convert(last, "{max_new_tokens}", "{limit}"),
    }


QWEN_AGENT_FILE = "qwen_agent/llm/fncall_prompts/qwen_fncall_prompt.py"
"""The Qwen-Agent module whose texts make the official tool block (``--qwen-agent DIR``)."""


def _constants(source: _Source) -> dict[str, object]:
    """The module-level names of ``source`` bound to texts built from string constants (``+``
    and ``%`` of texts and names bound before, and dicts of them), evaluated without running it."""
    env: dict[str, object] = {}

    def value(node: ast.AST) -> object:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name) and node.id in env:
            return env[node.id]
        if isinstance(node, ast.Tuple):
            return tuple(value(item) for item in node.elts)
        if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) for k in node.keys):
            return {k.value: value(v) for k, v in zip(node.keys, node.values)}
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
            left, right = value(node.left), value(node.right)
            if isinstance(left, str) and isinstance(node.op, ast.Add) and isinstance(right, str):
                return left + right
            if isinstance(left, str) and isinstance(node.op, ast.Mod) and isinstance(right, (str, tuple)):
                return left % right
        raise ValueError("not a text")

    for node in source.tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                env[node.targets[0].id] = value(node.value)
            except (ValueError, TypeError):
                continue
    return env


def _english(found: object, where: str, what: str) -> str:
    if not isinstance(found, dict) or not isinstance(found.get("en"), str):
        raise OfficialTextError(f"{where}: expected {what} as a dict with an 'en' text")
    return found["en"]


def _assigned(function: ast.AST, target: str) -> list[ast.expr]:
    return [n.value for n in ast.walk(function)
            if isinstance(n, ast.Assign) and [ast.unparse(t) for t in n.targets] == [target]]


def _join_separator(function: ast.AST, target: str, where: str) -> str:
    """The text ``SEP`` of ``target = SEP.join(...)`` in ``function``."""
    found = [v.func.value.value for v in _assigned(function, target)
             if isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "join"
             and isinstance(v.func.value, ast.Constant) and isinstance(v.func.value.value, str)]
    return _one(found, where, f"`{target} = <text>.join(...)`")


def _official_tools(functions: _Source) -> list[dict]:
    """The official memory tools' ``function`` schemas, as ``functions.py`` builds them for a memory
    with every memory type enabled (every data source of the official config includes the core):
    each ``ToolFunction`` class of ``MEMORY_TOOL_FUNCTIONS``, its ``name``, ``description`` and
    ``Parameter(...)`` list (type, description, enum; ``required`` unless ``required=False``)."""
    where = f"{functions.where}: MEMORY_TOOL_FUNCTIONS"
    listed = [n.value for n in functions.tree.body if isinstance(n, ast.Assign)
              and [ast.unparse(t) for t in n.targets] == ["MEMORY_TOOL_FUNCTIONS"]]
    if (
        len(listed) != 1
        or not isinstance(listed[0], ast.List)
        or not all(isinstance(e, ast.Name) for e in listed[0].elts)
    ):
        raise OfficialTextError(f"{where}: expected one list of tool classes")
    classes = {n.name: n for n in functions.tree.body if isinstance(n, ast.ClassDef)}
    tools = []
    for element in listed[0].elts:
        name = element.id  # type: ignore[attr-defined]
        if name not in classes:
            raise OfficialTextError(f"{functions.where}: no class {name}")
        where_class = f"{functions.where}: {name}"
        attributes = {ast.unparse(n.targets[0]): n.value for n in classes[name].body
                      if isinstance(n, ast.Assign) and len(n.targets) == 1}
        texts = {key: attributes.get(key) for key in ("name", "description")}
        if not all(isinstance(v, ast.Constant) and isinstance(v.value, str) for v in texts.values()):
            raise OfficialTextError(f"{where_class}: expected text attributes name and description")
        parameters = attributes.get("parameters")
        if not isinstance(parameters, ast.List):
            raise OfficialTextError(f"{where_class}: expected a parameters list")
        properties, required = {}, []
        for call in parameters.elts:
            if not (isinstance(call, ast.Call) and ast.unparse(call.func) == "Parameter" and not call.args):
                raise OfficialTextError(
                    f"{where_class}: expected Parameter(...) calls with keyword arguments"
                )
            try:
                given = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
            except ValueError:
                raise OfficialTextError(f"{where_class}: a Parameter argument is not a constant") from None
            if not {"name", "type", "description"} <= set(given):
                raise OfficialTextError(f"{where_class}: a Parameter lacks its name, type or description")
            spec = {"type": given["type"], "description": given["description"]}
            if given.get("enum"):
                spec["enum"] = list(given["enum"])
            properties[given["name"]] = spec
            if given.get("required", True):
                required.append(given["name"])
        tools.append({
            "name": texts["name"].value,  # type: ignore[union-attr]
            "description": texts["description"].value,  # type: ignore[union-attr]
            "parameters": {"type": "object", "properties": properties, "required": required},
        })
    return tools


def _qwen_agent_file(folder: Path) -> Path:
    for candidate in (folder / QWEN_AGENT_FILE, folder / QWEN_AGENT_FILE.removeprefix("qwen_agent/")):
        if candidate.is_file():
            return candidate
    raise OfficialTextError(f"{folder}: no Qwen-Agent install (missing {QWEN_AGENT_FILE})")


def qwen_tool_block(root: str | Path, qwen_agent: str | Path) -> str:
    """The official memorising tool block, as a template without placeholders.

    The official code passes the memory tools of ``functions.py`` (:func:`_official_tools`) to
    Qwen-Agent's ``QwenFnCallPrompt.preprocess_fncall_messages`` with ``lang='en'`` and
    ``parallel_function_calls=True`` (``agent.py``), which appends, after an empty line, the
    block built here to the system message. From ``qwen_fncall_prompt.py`` of the Qwen-Agent
    install in ``qwen_agent`` (the site-packages folder, a clone of Qwen-Agent, or its
    ``qwen_agent`` package folder; read with :mod:`ast`, never imported): the block template
    ``FN_CALL_TEMPLATE['en_parallel']``, filled with ``tool_descs`` (each tool's text, joined by
    the separator ``preprocess_fncall_messages`` joins them with) and ``tool_names`` (the names,
    likewise); a tool's text is the ``'en'`` template of ``get_function_description`` filled with
    its name (for human and model alike), description, its parameters as JSON (``json.dumps``,
    non-ASCII kept) and the ``'en'`` argument-format text of a tool other than
    ``code_interpreter``, trailing white space removed.
    """
    root = Path(root)
    if not (root / "functions.py").is_file():
        raise OfficialTextError(
            f"{root}: not a clone of the official Mem-alpha repository (missing functions.py)"
        )
    tools = _official_tools(_Source(root, "functions.py"))
    file = _qwen_agent_file(Path(qwen_agent))
    source = _Source(file.parent, file.name)
    source.where = QWEN_AGENT_FILE
    by_language = _constants(source).get("FN_CALL_TEMPLATE")  # the official call: lang='en', parallel calls
    block = by_language.get("en_parallel") if isinstance(by_language, dict) else None
    if not isinstance(block, str):
        raise OfficialTextError(f"{source.where}: no FN_CALL_TEMPLATE['en_parallel'] text")
    where_pre = f"{source.where}: QwenFnCallPrompt.preprocess_fncall_messages"
    preprocess = source.function("QwenFnCallPrompt.preprocess_fncall_messages")
    desc_join = _join_separator(preprocess, "tool_descs", where_pre)
    name_join = _join_separator(preprocess, "tool_names", where_pre)
    where_desc = f"{source.where}: get_function_description"
    describe = source.function("get_function_description")
    templates = [v for v in _assigned(describe, "tool_desc_template") if isinstance(v, ast.Dict)]
    if len(templates) != 1:
        raise OfficialTextError(f"{where_desc}: expected one tool_desc_template dict")
    tool_text = _english(ast.literal_eval(templates[0]), where_desc, "tool_desc_template")
    branches = [
        n for n in ast.walk(describe) if isinstance(n, ast.If) and "'code_interpreter'" in ast.unparse(n.test)
    ]
    formats = [
        v for b in branches for s in b.orelse for v in _assigned(s, "args_format") if isinstance(v, ast.Dict)
    ]
    if len(formats) != 1:
        raise OfficialTextError(
            f"{where_desc}: expected one args_format dict for tools other than code_interpreter"
        )
    args_format = _english(ast.literal_eval(formats[0]), where_desc, "args_format")
    fields = {"name_for_human", "name_for_model", "description_for_model", "parameters", "args_format"}
    problem = None
    try:
        if {n for _, n, _, _ in string.Formatter().parse(tool_text) if n is not None} != fields:
            problem = f"{where_desc}: the 'en' tool template must have the fields {sorted(fields)}"
        elif (
            {n for _, n, _, _ in string.Formatter().parse(block) if n is not None}
            != {"tool_descs", "tool_names"}
        ):
            problem = (
                f"{source.where}: FN_CALL_TEMPLATE['en_parallel'] "
                "must have the fields ['tool_descs', 'tool_names']"
            )
    except ValueError:
        problem = f"{source.where}: a tool-block template is not a valid format string"
    if problem:
        raise OfficialTextError(problem)
    descriptions = [
        tool_text.format(
            name_for_human=t["name"],
            name_for_model=t["name"],
            description_for_model=t["description"],
            parameters=json.dumps(t["parameters"], ensure_ascii=False),
            args_format=args_format,
        ).rstrip()
        for t in tools
    ]
    return _escape(
        block.format(
            tool_descs=desc_join.join(descriptions), tool_names=name_join.join(t["name"] for t in tools)
        )
    )


def import_official(root: str | Path, qwen_agent: str | Path | None = None) -> dict[str, str]:
    """Every template, from the official repository cloned at ``root`` (see the module docstring);
    with ``qwen_agent`` (a local Qwen-Agent install) ``tool_block_qwen`` is the official tool
    block (:func:`qwen_tool_block`), else memalpha's.

    Raises a one-line ``ValueError`` when ``root`` is not such a clone or a text is not found
    (naming the file and the name it looked for).
    """
    root = Path(root)
    if not root.is_dir():
        raise OfficialTextError(f"{root}: not a folder")
    absent = [f for f in REQUIRED_FILES if not (root / f).is_file()]
    if absent:
        raise OfficialTextError(
            f"{root}: not a clone of the official Mem-alpha repository (missing {', '.join(absent)})"
        )
    texts = {
        **_memory_texts(_Source(root, "memory.py")),
        **_server_texts(_Source(root, "memory_server.py")),
        **_user_texts(root),
        "answer_user": _instruction_join(_Source(root, "memalpha/llm_agent/generation.py")),
        "answer_judge": _answer_judge(_Source(root, "long_context_eval.py")),
    }
    texts["compact_system"] = texts["memorise_system"]
    texts["compact_user"] = texts["memorise_user"]
    ours = default_templates()
    for name in ("tool_block_qwen", "tool_block_hermes", "tool_block_hermes_compact"):
        texts[name] = getattr(ours, name)
    if qwen_agent is not None:
        texts["tool_block_qwen"] = qwen_tool_block(root, qwen_agent)
    return check_templates(
        {name: texts[name] for name in TEMPLATE_NAMES if name in texts}, f"{root} (imported)"
    )

