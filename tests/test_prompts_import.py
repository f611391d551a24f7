"""``memalpha prompts import``: a template file from a folder in the official repository's layout.

The stand-in folder is written here with made-up texts (the official code's file paths, class,
function and variable names, none of its wording), so the test knows every text the importer
must find and where each placeholder must land.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from memalpha.agent.memorise_prompts import (
    answer_judge_prompt,
    content_judge_messages,
    memorise_messages,
    render_memorise,
)
from memalpha.cli import run
from memalpha.memory.store import Memory
from memalpha.reader.answer_prompts import answer_messages, render_answer
from memalpha.templates.loader import default_templates, load_templates
from memalpha.templates.official import QWEN_AGENT_FILE, REQUIRED_FILES, import_official, qwen_tool_block
from memalpha.tools.formats import get_call_format

MEMORY_PY = '''
class Memory:
    def _block(self, title: str = '', lines=[], content=None) -> str:
        if content is not None:
            return f"<{title}>\\n{content}\\n</{title}>" if title else content
        if not lines:
            if title:
                return f"<{title}>\\nNOTHING HERE\\n</{title}>"
            return f"NOTHING HERE"
        return "\\n".join(f"[{i}] {c}" for mem in lines for i, c in mem.items())

    def render_system_prompt(self, status="chat", query=None, max_num_of_recent_chunks=None):
        semantic_items, episodic_items = self.semantic, self.episodic
        core_memory_section = f"<core_memory>\\n{self.core}\\n</core_memory>"
        if status == "memorie":
            memory_type_instructions = []
            memory_type_instructions.append("* core_memory: the gist {in braces}")
            memory_type_instructions.append("* semantic_memory: plain facts")
            memory_type_instructions.append("* episodic_memory: dated happenings")
            memory_type_instructions.append("* No memory modules at all.")
            total_semantic = len(self.semantic)
            visible_semantic = len(semantic_items)
            memory_state_sections = [
                f"<semantic_memory> [latest {visible_semantic} / {total_semantic}]\\n"
                f"{self._block(lines=semantic_items)}\\n"
                f"</semantic_memory>"
            ]
            memory_state_text = "\\n\\n".join(memory_state_sections)
            instructions_text = "\\n".join(memory_type_instructions)
            system_prompt = (f"""KEEPER OF NOTES.
Kinds:
{instructions_text}
STATE:
{memory_state_text}
Reply {{"done": true}} when finished.""")
            return [{"role": "system", "content": system_prompt}]
        return [{"role": "system", "content": f"chat mode {query}"}]
'''

SERVER_PY = '''
class MemoryProcessor:
    def analyze_memory_content(self, memory_type: str, content: str):
        system_prompt = self._get_analysis_prompt(memory_type)
        messages = [{"role": "system", "content": system_prompt},
                    {"role": "user", "content": f"Grade this {memory_type} note:\\n\\n{content}"}]
        for attempt in range(3):
            reply = self.ask(messages)
            if reply is None:
                messages[1]["content"] += "\\n\\nAGAIN, {in braces}."
                continue
            return reply
        return messages

    def _get_analysis_prompt(self, memory_type: str) -> str:
        """Rules per kind."""
        if memory_type == 'core':
            return """CORE RULES {"VALID": bool}"""
        elif memory_type == 'semantic':
            return """SEMANTIC RULES"""
        elif memory_type == 'episodic':
            return """EPISODIC RULES"""
        else:
            raise ValueError(f"Unknown memory type: {memory_type}")

    def _format_memory_block(self, memory_list, block_name: str) -> str:
        if not memory_list:
            return f"<{block_name}>\\n(nothing retrieved)\\n</{block_name}>"
        lines = [f"{i}. {m}" for i, m in enumerate(memory_list, 1)]
        return f"<{block_name}>\\n" + "\\n".join(lines) + f"\\n</{block_name}>"

    def construct_system_prompt(self, memory_data, original_memory_data=None) -> str:
        memory_blocks = []
        memory_structure_items = []
        if memory_data.get("core"):
            memory_structure_items.append("- Core: the gist")
        memory_structure_items.extend([
            "- Semantic: facts",
            "- Episodic: events",
        ])
        memory_structure = "\\n".join(memory_structure_items)
        memory_content = "\\n\\n".join(memory_blocks)
        system_prompt = f"""READER.
Parts:
{memory_structure}
Memory:
{memory_content}
End."""
        return system_prompt
'''

GENERATION_PY = """
def questions(self, qa_list, idx, data_sources):
    return [{'question': self.prompts_wrt_datasource[data_sources[idx]]['query_prompt']
                         + " || " + qa['question']}
            for qa in qa_list]
"""

EVAL_PY = '''
class LongContextEvaluator:
    def _compute_score(self, data_source, predicted_answer, gold_answer, question=None):
        if data_source.startswith('longmemeval_s'):
            template = "JUDGE {{x}}. Q={} R={} A={} ok?"
            prompt = template.format(question, gold_answer, predicted_answer)
            return prompt
        return 0.0
'''

CONFIG = {
    "unified_prompt": (
        "STORE THIS {{literal}}.\n\n<new_chunk>\n{context}\n</new_chunk>\n\nAt most {max_new_tokens} tokens."
    ),
    "booksum": {"query_prompt": "About the book.", "including_core": True},
}


def write_stand_in(root: Path) -> Path:
    files = {
        "memory.py": MEMORY_PY,
        "memory_server.py": SERVER_PY,
        "memalpha/llm_agent/generation.py": GENERATION_PY,
        "long_context_eval.py": EVAL_PY,
        "config/prompts_wrt_datasource.yaml": yaml.safe_dump(CONFIG),
    }
    assert set(files) == set(REQUIRED_FILES)
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def test_import_writes_a_file_that_renders_the_stand_in_texts(tmp_path, capsys):
    root = write_stand_in(tmp_path / "clone")
    out = tmp_path / "out" / "official.yaml"
    assert run(["prompts", "import", str(root), "--output", str(out)]) is None
    assert "wrote" in capsys.readouterr().out
    t = load_templates(out)
    memory = Memory(seed=3)
    entry = memory.insert("semantic_memory", "fact a")
    view = render_memorise(memory, 5, t)
    assert view == (
        "<core_memory>\n\n</core_memory>\n\n"
        f"<semantic_memory> [latest 1 / 1]\n[{entry.id}] fact a\n</semantic_memory>\n\n"
        "<episodic_memory> [latest 0 / 0]\nNOTHING HERE\n</episodic_memory>"
    )
    assert "NOTHING HERE" in render_memorise(memory, 0, t)  # a hidden list shows as an empty one
    system, user = memorise_messages(view, "the {chunk}", get_call_format("qwen"), 1638, templates=t)
    tool_block = get_call_format("qwen").instructions(templates=default_templates())
    assert system["content"] == (
        "KEEPER OF NOTES.\nKinds:\n* core_memory: the gist {in braces}\n* semantic_memory: plain facts\n"
        f"* episodic_memory: dated happenings\nSTATE:\n{view}\n" + 'Reply {"done": true} when finished.'
        f"\n\n{tool_block}"
    )
    assert user["content"] == (
        "STORE THIS {literal}.\n\n<new_chunk>\nthe {chunk}\n</new_chunk>\n\nAt most 1638 tokens."
    )
    compact = memorise_messages(view, "c", get_call_format("qwen"), None, "compact", templates=t)
    assert compact[1]["content"] == "STORE THIS {literal}.\n\n<new_chunk>\nc\n</new_chunk>"
    with_core = answer_messages(render_answer(memory, [], [], t), "Who?", "About the book.", t, has_core=True)
    assert with_core[0]["content"] == (
        "READER.\nParts:\n- Core: the gist\n- Semantic: facts\n- Episodic: events\nMemory:\n"
        "<semantic_memory>\n(nothing retrieved)\n</semantic_memory>\n\n"
        "<episodic_memory>\n(nothing retrieved)\n</episodic_memory>\nEnd."
    )
    assert with_core[1]["content"] == "About the book. || Who?"
    no_core = answer_messages("M", "Who?", None, t, has_core=False)
    assert no_core == [
        {
            "role": "system",
            "content": "READER.\nParts:\n- Semantic: facts\n- Episodic: events\nMemory:\nM\nEnd.",
        },
        {"role": "user", "content": "Who?"},
    ]
    assert content_judge_messages("episodic", "e", t) == [
        {"role": "system", "content": "EPISODIC RULES"},
        {"role": "user", "content": "Grade this episodic note:\n\ne"},
    ]
    # the official judge's split: the kind's rules as the system message, the entry as the user message
    assert "content_judge_system: '{rules}'" in out.read_text(encoding="utf-8")
    assert t.content_judge_system == "{rules}" and t.content_judge == "Grade this {kind} note:\n\n{content}"
    assert content_judge_messages("core", "x {y}", t) == [
        {"role": "system", "content": 'CORE RULES {"VALID": bool}'},
        {"role": "user", "content": "Grade this core note:\n\nx {y}"},
    ]
    assert answer_judge_prompt("q", "r", "a", t) == "JUDGE {x}. Q=q R=r A=a ok?"
    # the text the per-call judge appends to its user message before asking again
    assert t.render("content_judge_retry") == "\n\nAGAIN, {in braces}."


FUNCTIONS_PY = """
from dataclasses import dataclass


@dataclass
class Parameter:
    name: str
    type: str
    description: str
    required: bool = True
    enum: list = None


class ToolFunction:
    name: str
    description: str


class NewMemoryInsert(ToolFunction):
    name = "new_memory_insert"
    description = "Put a note {somewhere}."
    parameters = [
        Parameter(name="memory_type", type="string", description="Which list.",
                  enum=["semantic_memory", "episodic_memory"]),
        Parameter(name="content", type="string", description="The note, café."),
    ]


class MemoryDelete(ToolFunction):
    name = "memory_delete"
    description = "Drop a note."
    parameters = [
        Parameter(name="memory_type", type="string", description="Which.",
                  enum=["core_memory", "semantic_memory"]),
        Parameter(name="memory_id", type="string", description="Its id.", required=False),
    ]


class SearchMemory(ToolFunction):
    name = "search_memory"
    description = "Not a memorising tool."
    parameters = []


MEMORY_TOOL_FUNCTIONS = [NewMemoryInsert, MemoryDelete]
SEARCH_TOOL_FUNCTIONS = [SearchMemory]
"""

QWEN_FNCALL_PY = '''
FN_NAME = '<<F>>'
FN_ARGS = '<<A>>'

INFO_ZH = """ZH TOOLBOX {tool_descs}"""
INFO_EN = """TOOLBOX

{tool_descs}"""
FMT_EN = """ONE CALL %s [{tool_names}]""" % (FN_NAME,)
FMT_PARA_EN = """CALLS
%s: one of [{tool_names}]
%s: its input""" % (FN_NAME, FN_ARGS)

FN_CALL_TEMPLATE = {
    'zh_parallel': INFO_ZH + '\\n' + FMT_PARA_EN,
    'en': INFO_EN + '\\n\\n' + FMT_EN,
    'en_parallel': INFO_EN + '\\n\\n' + FMT_PARA_EN,
}


class QwenFnCallPrompt:

    @staticmethod
    def preprocess_fncall_messages(messages, functions, lang, parallel_function_calls=True, **kwargs):
        tool_desc_template = FN_CALL_TEMPLATE[lang + ('_parallel' if parallel_function_calls else '')]
        tool_descs = ' ~~ '.join(get_function_description(function, lang=lang) for function in functions)
        tool_names = '|'.join(function.get('name') for function in functions)
        return tool_desc_template.format(tool_descs=tool_descs, tool_names=tool_names)


def get_function_description(function, lang):
    tool_desc_template = {
        'zh': 'ZH {name_for_human} {name_for_model} {description_for_model} {parameters} {args_format}',
        'en': ('## {name_for_human}\\n{name_for_model} does {description_for_model} '
               'ARGS {parameters} {args_format}   '),
    }
    name = function.get('name')
    if name == 'code_interpreter':
        args_format = {'zh': 'ZH FENCE', 'en': 'IN A FENCE'}
    else:
        args_format = {'zh': 'ZH JSON', 'en': 'AS JSON'}
    return tool_desc_template[lang].format(name_for_human=name, name_for_model=name,
                                           description_for_model=function['description'],
                                           parameters=str(function['parameters']),
                                           args_format=args_format).rstrip()
'''

OFFICIAL_BLOCK = (  # the stand-in's block for its two memorising tools, written out by hand
    "TOOLBOX\n\n"
    "## new_memory_insert\nnew_memory_insert does Put a note {somewhere}. ARGS "
    '{"type": "object", "properties": {"memory_type": {"type": "string", "description": "Which list.", '
    '"enum": ["semantic_memory", "episodic_memory"]}, '
    '"content": {"type": "string", "description": "The note, café."}}, '
    '"required": ["memory_type", "content"]} AS JSON'
    " ~~ "
    "## memory_delete\nmemory_delete does Drop a note. ARGS "
    '{"type": "object", "properties": {"memory_type": {"type": "string", "description": "Which.", '
    '"enum": ["core_memory", "semantic_memory"]}, '
    '"memory_id": {"type": "string", "description": "Its id."}}, '
    '"required": ["memory_type"]} AS JSON'
    "\n\nCALLS\n<<F>>: one of [new_memory_insert|memory_delete]\n<<A>>: its input"
)


def write_qwen_agent(site: Path) -> Path:
    """A stand-in Qwen-Agent install: ``site/qwen_agent/llm/fncall_prompts/qwen_fncall_prompt.py``."""
    file = site / QWEN_AGENT_FILE
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(textwrap.dedent(QWEN_FNCALL_PY), encoding="utf-8")
    return site


def test_import_with_qwen_agent_writes_the_official_tool_block(tmp_path, capsys):
    root = write_stand_in(tmp_path / "clone")
    (root / "functions.py").write_text(FUNCTIONS_PY, encoding="utf-8")
    site = write_qwen_agent(tmp_path / "site-packages")
    assert qwen_tool_block(root, site).replace("{{", "{").replace("}}", "}") == OFFICIAL_BLOCK
    # the package folder itself
    assert qwen_tool_block(root, site / "qwen_agent") == qwen_tool_block(root, site)
    out = tmp_path / "official.yaml"
    run(["prompts", "import", str(root), "--output", str(out), "--qwen-agent", str(site)])
    assert "built with the Qwen-Agent install" in out.read_text(encoding="utf-8")
    t = load_templates(out)
    view = render_memorise(Memory(), 5, t)
    for fmt_profile in (("qwen", "full"), ("qwen", "compact")):
        system, _ = memorise_messages(
            view, "c", get_call_format(fmt_profile[0]), 1638, fmt_profile[1], templates=t
        )
        assert system["content"].endswith(
            f"{view}\n" + 'Reply {"done": true} when finished.' + "\n\n" + OFFICIAL_BLOCK
        )
    # the hermes blocks, and the qwen block without --qwen-agent, stay memalpha's
    assert t.tool_block_hermes == default_templates().tool_block_hermes
    assert import_official(root)["tool_block_qwen"] == default_templates().tool_block_qwen


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (
            lambda root, site: (site / QWEN_AGENT_FILE).unlink(),
            "no Qwen-Agent install (missing qwen_agent/llm/fncall_prompts/",
        ),
        (
            lambda root, site: (root / "functions.py").unlink(),
            "not a clone of the official Mem-alpha repository (missing functions.py)",
        ),
        (
            lambda root, site: (site / QWEN_AGENT_FILE).write_text(
                QWEN_FNCALL_PY.replace("'en_parallel'", "'en_para'")
            ),
            "qwen_fncall_prompt.py: no FN_CALL_TEMPLATE['en_parallel'] text",
        ),
        (
            lambda root, site: (site / QWEN_AGENT_FILE).write_text(
                QWEN_FNCALL_PY.replace("{args_format}   ", "")
            ),
            "get_function_description: the 'en' tool template must have the fields",
        ),
        (
            lambda root, site: (root / "functions.py").write_text(
                FUNCTIONS_PY.replace("MEMORY_TOOL_FUNCTIONS =", "TOOLS =")
            ),
            "functions.py: MEMORY_TOOL_FUNCTIONS: expected one list of tool classes",
        ),
        (
            lambda root, site: (root / "functions.py").write_text(
                FUNCTIONS_PY.replace('"Drop a note."', "DROP")
            ),
            "functions.py: MemoryDelete: expected text attributes name and description",
        ),
    ],
)
def test_qwen_agent_errors_are_one_line(tmp_path, breakage, message):
    root = write_stand_in(tmp_path / "clone")
    (root / "functions.py").write_text(FUNCTIONS_PY, encoding="utf-8")
    site = write_qwen_agent(tmp_path / "site-packages")
    breakage(root, site)
    with pytest.raises(ValueError) as info:
        import_official(root, site)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (
            lambda root: (root / "memory_server.py").unlink(),
            "not a clone of the official Mem-alpha repository (missing memory_server.py)",
        ),
        (
            lambda root: (root / "memory.py").write_text("class Memory:\n    pass\n"),
            "memory.py: no function Memory.render_system_prompt",
        ),
        (
            lambda root: (root / "memory_server.py").write_text(
                SERVER_PY.replace("_get_analysis_prompt", "_rules")
            ),
            "memory_server.py: no function MemoryProcessor._get_analysis_prompt",
        ),
        (
            lambda root: (root / "long_context_eval.py").write_text(EVAL_PY.replace("template =", "other =")),
            (
                "long_context_eval.py: LongContextEvaluator._compute_score: "
                "expected one judge `template`, found 0"
            ),
        ),
        (
            lambda root: (root / "config/prompts_wrt_datasource.yaml").write_text("booksum: {}\n"),
            "config/prompts_wrt_datasource.yaml: no unified_prompt text",
        ),
        (
            lambda root: (root / "memory.py").write_text("def broken(:\n"),
            "memory.py: cannot be read as Python",
        ),
        (
            lambda root: (root / "memory_server.py").write_text(
                SERVER_PY.replace('messages[1]["content"] +=', "extra =")
            ),
            (
                "memory_server.py: MemoryProcessor.analyze_memory_content: expected one text appended to the "
                "user message's content on a retry, found 0"
            ),
        ),
    ],
)
def test_import_errors_are_one_line_naming_file_and_name(tmp_path, breakage, message):
    root = write_stand_in(tmp_path / "clone")
    breakage(root)
    with pytest.raises(ValueError) as info:
        import_official(root)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_import_command_exits_with_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        run(["prompts", "import", str(tmp_path)])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("memalpha prompts import: error: ") and "not a clone" in err and "\n" not in err
