#!/usr/bin/env python3
"""Generate the static shell completions in completions/ from the dsv4ctl command tree.

    python scripts/gen_completions.py           # (re)write completions/{dsv4ctl.bash,_dsv4ctl,dsv4ctl.fish}
    python scripts/gen_completions.py --check   # exit 1 and name the stale files, write nothing

The tree is ``typer.main.get_command(dsv4ctl.cli.app)``: every (non-hidden) command and
sub-command, its options (flags vs options taking a value), its positional arguments, click
choices, and value completions: profile arguments/options complete ``*.yaml``/``*.yml`` files,
folders and the shipped profile names; runbook names the shipped playbooks (``watch --on-alert``:
``[CONDITION=]RUNBOOK``; ``profile import srt-slurm`` RECIPE ``*.yaml`` files and ``--model`` the two
models); path-typed and tree/series parameters (and metavars FILE/PATH/DIR)
complete files or folders; ``plan --set`` completes the what-if keys (``dsv4ctl.plan.plan.SET_KEYS``)
followed by ``=``. Parameters named (or with the metavar) group, host or release complete the
values of the profile on the command line at TAB time: the scripts find the profile the command
line gives (its positional PROFILE or ``-p/--profile``) and run ``dsv4ctl __complete groups|servers|hosts|releases
PROFILE`` (:mod:`dsv4ctl.commands.complete`; no network, nothing printed on failure).
tests/test_completions.py regenerates the scripts in memory and fails when the committed files differ."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "completions"
FILES = ("dsv4ctl.bash", "_dsv4ctl", "dsv4ctl.fish")
PROG = "dsv4ctl"
REGEN = "python scripts/gen_completions.py"

# Parameters named like this complete folders / files whatever their click type.
DIR_PARAMS = {"tree", "series", "keep", "report_dir", "state_dir"}
FILE_PARAMS = {"serve_config", "config", "output", "file"}

# Parameters named (or with the metavar, upper case) like this take a value of the profile on the
# command line: ``dsv4ctl __complete KIND PROFILE`` lists them when TAB is pressed.
PROFILE_VALUES = {"group": "groups", "host": "hosts", "release": "releases"}
# Commands whose groups are server groups only (each refuses the router: it has no KV pools, GPUs
# or serve config): their groups complete as ``servers`` (every group but a router).
SERVER_GROUP_COMMANDS = {("plan",), ("facts",), ("config", "lint"), ("config", "set"), ("hicache", "on"),
                         ("hicache", "off"), ("hicache", "status")}

# {"kind": none|any|file|dir|yaml|profile|words|keyed|dyn, "words": [...], "suffix": "=" or "",
#  "keys": [...] (keyed: [KEY=]WORD), "what": groups|servers|hosts|releases (dyn)}. "profile" is "yaml"
# (shipped names + YAML files + folders) for the parameter that names the profile, which the
# scripts remember for the dyn values.
Kind = dict[str, Any]


def _shipped_stems(folder: str) -> list[str]:
    from dsv4ctl.resources import shipped_dir
    d = shipped_dir(folder)
    return sorted({p.stem for p in d.glob("*.yaml")} | {p.stem for p in d.glob("*.yml")}) if d.is_dir() else []


def _is_profile(param) -> bool:
    """The parameter that names the profile: the positional ``profile`` (``runbook run``'s
    ``[PROFILE]``) or the ``-p/--profile`` option (``profile_opt``, added by commands/grammar.py)."""
    name = param.name or ""
    metavar = (getattr(param, "metavar", None) or "").strip("[].").upper()
    return name == "profile" or name.startswith("profile_") or metavar == "PROFILE"


def _hook(path: tuple[str, ...], param) -> Kind | None:
    """Value completions that the click types cannot express."""
    name = param.name
    metavar = (getattr(param, "metavar", None) or "").upper()
    if path == ("plan",) and name == "set_":
        from dsv4ctl.plan.plan import SET_KEYS
        return {"kind": "words", "words": sorted(SET_KEYS), "suffix": "="}
    if path[:1] == ("runbook",) and name == "name":
        return {"kind": "yaml", "words": _shipped_stems("playbooks")}
    if name == "on_alert":         # [CONDITION=]RUNBOOK
        from dsv4ctl.watch.model import CONDITIONS
        return {"kind": "keyed", "keys": list(CONDITIONS), "words": _shipped_stems("playbooks")}
    if name == "recipe":           # profile import srt-slurm RECIPE: a YAML file
        return {"kind": "yaml", "words": []}
    if path == ("profile", "import", "srt-slurm") and name == "model":
        from dsv4ctl.profile.srtslurm import MODELS
        return {"kind": "words", "words": [n for n, _ in MODELS.values()]}
    if _is_profile(param):         # the shipped ones only: an operator's profiles/my.yaml is not shipped
        from dsv4ctl.resources import shipped_profile_names
        return {"kind": "profile", "words": shipped_profile_names()}
    what = PROFILE_VALUES.get(name) or PROFILE_VALUES.get(metavar.lower())
    if what == "groups" and path in SERVER_GROUP_COMMANDS:
        what = "servers"
    if what:
        return {"kind": "dyn", "what": what}
    return None


def _value_kind(path: tuple[str, ...], param) -> Kind:
    """How to complete the value(s) of one click parameter."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return {"kind": "none"}
    hooked = _hook(path, param)
    if hooked is not None:
        return hooked
    t = param.type
    choices = getattr(t, "choices", None)
    if choices:
        return {"kind": "words", "words": [str(c) for c in choices]}
    if t.name in ("boolean",):
        return {"kind": "words", "words": ["true", "false"]}
    metavar = (getattr(param, "metavar", None) or "").upper()
    if param.name in DIR_PARAMS or metavar in ("DIR", "FOLDER", "DIRECTORY"):
        return {"kind": "dir"}
    if param.name in FILE_PARAMS or t.name == "filename" or metavar in ("FILE", "PATH"):
        return {"kind": "file"}
    if t.name == "path" or type(t).__name__.endswith("Path"):
        if getattr(t, "dir_okay", True) and not getattr(t, "file_okay", True):
            return {"kind": "dir"}
        return {"kind": "file"}
    return {"kind": "any"}


def _first_line(text: str | None, limit: int = 80) -> str:
    s = " ".join((text or "").strip().split("\n\n")[0].split())
    s = s.replace("``", "").replace("`", "")
    if len(s) > limit:
        s = s[: limit - 3].rstrip() + "..."
    return s


def build_model(cmd=None) -> dict:
    """The completion model of the CLI: nested dicts, JSON-able, deterministic.

    ``{"path": [...], "help": str, "options": [{"names", "help", "value", "multiple"}],
    "args": [{"name", "nargs", "required", "value"}], "subs": [...]}``."""
    if cmd is None:
        import typer

        from dsv4ctl.cli import app
        cmd = typer.main.get_command(app)
    help_names = list((cmd.context_settings or {}).get("help_option_names", ["--help"]))
    return _node(cmd, (), help_names)


def _node(cmd, path: tuple[str, ...], help_names: list[str]) -> dict:
    options, args = [], []
    for p in cmd.params:
        if getattr(p, "hidden", False):
            continue
        if p.param_type_name == "argument":
            args.append({"name": p.name, "nargs": p.nargs, "required": bool(p.required),
                         "value": _value_kind(path, p)})
        else:
            names = sorted(list(p.opts) + list(p.secondary_opts), key=lambda n: (n.startswith("--"), n))
            options.append({"names": names, "help": _first_line(getattr(p, "help", None)),
                            "value": _value_kind(path, p), "multiple": bool(getattr(p, "multiple", False))})
    options.append({"names": sorted(help_names, key=lambda n: (n.startswith("--"), n)),
                    "help": "Show this message and exit.", "value": {"kind": "none"}, "multiple": False})
    subs = []
    for name, sub in (getattr(cmd, "commands", None) or {}).items():
        if getattr(sub, "hidden", False):
            continue
        subs.append(_node(sub, path + (name,), help_names))
    return {"path": list(path), "help": _first_line(cmd.short_help or cmd.help),
            "options": options, "args": args, "subs": subs}


def _walk(node: dict):
    yield node
    for s in node["subs"]:
        yield from _walk(s)


def _words_id(words: list[str], table: dict[tuple, str]) -> str:
    key = tuple(words)
    if key not in table:
        table[key] = f"w{len(table) + 1}"
    return table[key]


HEADER = ("{c} {shell} completion for dsv4ctl. GENERATED by scripts/gen_completions.py from the\n"
          "{c} dsv4ctl command tree: do not edit; regenerate with `" + REGEN + "`.\n")


# --------------------------------------------------------------------------------------- bash
def _kind_tag(v: Kind, words: dict[tuple, str]) -> str:
    k = v["kind"]
    if k == "words":
        return ("wn:" if v.get("suffix") else "w:") + _words_id(v["words"], words)
    if k in ("yaml", "profile"):
        return ("prof:" if k == "profile" else "yaml:") + _words_id(v["words"], words)
    if k == "keyed":
        return f"k:{_words_id(v['keys'], words)}:{_words_id(v['words'], words)}"
    if k == "dyn":
        return "dyn:" + v["what"]
    return k


def _bq(s: str) -> str:
    """A bash single-quoted word."""
    return "'" + s.replace("'", "'\\''") + "'"


def render_bash(model: dict) -> str:
    """completions/dsv4ctl.bash: ``complete -F _dsv4ctl dsv4ctl``; needs bash >= 4.2, no
    bash-completion package. Works from COMP_LINE so ``--set KEY=`` and ``--opt=value`` work
    whatever COMP_WORDBREAKS holds."""
    words: dict[tuple, str] = {}
    subs_cases, opts_cases, optkind_cases, arg_cases, rest_cases = [], [], [], [], []
    for n in _walk(model):
        p = " ".join(n["path"])
        if n["subs"]:
            subs_cases.append(f"    {_bq(p)}) echo {_bq(' '.join(s['path'][-1] for s in n['subs']))} ;;")
        opts_cases.append(f"    {_bq(p)}) echo {_bq(' '.join(x for o in n['options'] for x in o['names']))} ;;")
        for o in n["options"]:
            if o["value"]["kind"] != "none":
                pats = "|".join(_bq(f"{p}|{x}") for x in o["names"])
                optkind_cases.append(f"    {pats}) echo {_kind_tag(o['value'], words)} ;;")
        for i, a in enumerate(n["args"]):
            tag = _kind_tag(a["value"], words)
            if a["nargs"] == -1:  # this and every later position
                rest_cases.append(f"    {_bq(p)}) [[ $2 -ge {i} ]] && echo {tag} ;;")
                break
            arg_cases.append(f"    {_bq(p + '|' + str(i))}) echo {tag} ;;")
    out = [HEADER.format(c="#", shell="bash"),
           "# Install: `source completions/dsv4ctl.bash`, or copy it to",
           "# ~/.local/share/bash-completion/completions/dsv4ctl (bash-completion loads it on demand).",
           ""]
    for ws, wid in words.items():
        out.append(f"_dsv4ctl_{wid}={_bq(' '.join(ws))}")
    out += ["",
            "# sub-commands of a command path",
            "_dsv4ctl_subs() {", '  case "$1" in', *subs_cases, "  esac", "}", "",
            "# options of a command path",
            "_dsv4ctl_opts() {", '  case "$1" in', *opts_cases, "  esac", "}", "",
            "# value kind of an option that takes a value (nothing for flags)",
            "_dsv4ctl_optkind() {", '  case "$1|$2" in', *optkind_cases, "  esac", "}", "",
            "# value kind of the positional argument number $2 (0-based) of a command path",
            "_dsv4ctl_argkind() {", '  case "$1|$2" in', *arg_cases, "  esac",
            '  case "$1" in', *rest_cases, "  esac", "  return 0", "}", "",
            BASH_BODY]
    return "\n".join(out)


BASH_BODY = r'''# complete the value of kind $1 for the word $2
_dsv4ctl_values() {
  local kind="$1" cur="$2" w IFS=$' \t\n'
  case "$kind" in
    file) IFS=$'\n'; COMPREPLY=($(compgen -f -- "$cur")); compopt -o filenames 2>/dev/null ;;
    dir) IFS=$'\n'; COMPREPLY=($(compgen -d -- "$cur")); compopt -o filenames 2>/dev/null ;;
    yaml:* | prof:*)
      w="_dsv4ctl_${kind#*:}"
      COMPREPLY=($(compgen -W "${!w}" -- "$cur"))
      IFS=$'\n'
      COMPREPLY+=($(compgen -d -- "$cur") $(compgen -f -X '!*.yaml' -- "$cur") $(compgen -f -X '!*.yml' -- "$cur"))
      compopt -o filenames 2>/dev/null ;;
    w:*) w="_dsv4ctl_${kind#w:}"; COMPREPLY=($(compgen -W "${!w}" -- "$cur")) ;;
    wn:*)
      # KEY=VALUE words: complete the key, then nothing for the value
      if [[ "$cur" != *=* ]]; then
        w="_dsv4ctl_${kind#wn:}"
        COMPREPLY=($(compgen -W "${!w}" -S = -- "$cur"))
        compopt -o nospace 2>/dev/null
      fi ;;
    k:*)
      # [KEY=]WORD values: a word, or KEY= and then a word
      w="${kind#k:}"
      local keys="_dsv4ctl_${w%%:*}" vals="_dsv4ctl_${w#*:}"
      if [[ "$cur" == *=* ]]; then
        # bash replaces only the part after "=" when "=" breaks words
        [[ "$COMP_WORDBREAKS" == *=* ]] && w="" || w="${cur%%=*}="
        COMPREPLY=($(compgen -W "${!vals}" -P "$w" -- "${cur#*=}"))
      else
        COMPREPLY=($(compgen -W "${!vals}" -- "$cur") $(compgen -W "${!keys}" -S = -- "$cur"))
        [[ ${#COMPREPLY[@]} -eq 1 && "${COMPREPLY[0]}" == *= ]] && compopt -o nospace 2>/dev/null
      fi ;;
    dyn:*)
      # a value of the profile on the command line ($3), from `dsv4ctl __complete` (no network)
      IFS=$'\n'
      COMPREPLY=($(compgen -W "$(command dsv4ctl __complete "${kind#dyn:}" "$3" 2>/dev/null)" -- "$cur")) ;;
  esac
}

_dsv4ctl() {
  local line cur path="" npos=0 pending="" i w kind prefix="" profile=""
  local -a words
  COMPREPLY=()
  line="${COMP_LINE:0:COMP_POINT}"
  read -ra words <<< "$line"
  if [[ -z "$line" || "$line" =~ [[:space:]]$ ]]; then
    cur=""
  else
    cur="${words[${#words[@]}-1]}"
    unset 'words[${#words[@]}-1]'
  fi
  for ((i = 1; i < ${#words[@]}; i++)); do
    w="${words[i]}"
    if [[ -n "$pending" ]]; then
      [[ "$(_dsv4ctl_optkind "$path" "$pending")" == prof:* ]] && profile="$w"
      pending=""
      continue
    fi
    case "$w" in
      --) ;;
      --*=*) [[ "$(_dsv4ctl_optkind "$path" "${w%%=*}")" == prof:* ]] && profile="${w#*=}" ;;
      -*) [[ -n "$(_dsv4ctl_optkind "$path" "$w")" ]] && pending="$w" ;;
      *)
        if [[ $npos -eq 0 && " $(_dsv4ctl_subs "$path") " == *" $w "* ]]; then
          path="${path:+$path }$w"
        else
          [[ "$(_dsv4ctl_argkind "$path" "$npos")" == prof:* ]] && profile="$w"
          npos=$((npos + 1))
        fi ;;
    esac
  done
  if [[ -n "$pending" ]]; then
    kind="$(_dsv4ctl_optkind "$path" "$pending")"
  elif [[ "$cur" == --*=* ]]; then
    kind="$(_dsv4ctl_optkind "$path" "${cur%%=*}")"
    prefix="${cur%%=*}="
    cur="${cur#*=}"
  elif [[ "$cur" == -* ]]; then
    COMPREPLY=($(compgen -W "$(_dsv4ctl_opts "$path")" -- "$cur"))
    return 0
  elif [[ $npos -eq 0 && -n "$(_dsv4ctl_subs "$path")" ]]; then
    COMPREPLY=($(compgen -W "$(_dsv4ctl_subs "$path")" -- "$cur"))
    return 0
  else
    kind="$(_dsv4ctl_argkind "$path" "$npos")"
  fi
  [[ -n "$kind" ]] || return 0
  _dsv4ctl_values "$kind" "$cur" "$profile"
  # "--opt=value": bash replaces only the part after "=" when "=" breaks words
  if [[ -n "$prefix" && "$COMP_WORDBREAKS" != *=* ]]; then
    for i in "${!COMPREPLY[@]}"; do COMPREPLY[i]="$prefix${COMPREPLY[i]}"; done
  fi
  return 0
}

complete -F _dsv4ctl dsv4ctl
'''


# ---------------------------------------------------------------------------------------- zsh
def _zq(s: str) -> str:
    """A zsh single-quoted word."""
    return "'" + s.replace("'", "'\\''") + "'"


def _zdesc(s: str) -> str:
    """Text inside an _arguments ``[...]`` description."""
    return re.sub(r"([\[\]\\:])", r"\\\1", s)


def _profile_at(node: dict) -> str:
    """Where command ``node`` takes the profile, as _dsv4ctl_dyn's arguments: the 1-based index of
    the positional PROFILE in ``$line`` (0: none), then the names of the profile options."""
    idx = next((i + 1 for i, a in enumerate(node["args"]) if a["value"]["kind"] == "profile"), 0)
    opts = [x for o in node["options"] if o["value"]["kind"] == "profile" for x in o["names"]]
    return " ".join([str(idx)] + opts)


def _zaction(v: Kind, fn_words: dict[tuple, str], node: dict | None = None) -> str:
    k = v["kind"]
    if k == "file":
        return "_files"
    if k == "dir":
        return "_files -/"
    if k in ("yaml", "profile"):
        return f"_dsv4ctl_yaml_{_words_id(['yaml'] + v['words'], fn_words)}"
    if k == "keyed":
        return f"_dsv4ctl_keyed_{_words_id(['keyed', len(v['keys'])] + v['keys'] + v['words'], fn_words)}"
    if k == "dyn":      # a leading space: _arguments runs it as is (the compadd options are in $expl)
        return f" _dsv4ctl_dyn {v['what']} {_profile_at(node or {'args': [], 'options': []})}"
    if k == "words":
        if v.get("suffix"):
            return f"_dsv4ctl_keys_{_words_id(['keys'] + v['words'], fn_words)}"
        return "(" + " ".join(re.sub(r"([\s()\\'])", r"\\\1", w) for w in v["words"]) + ")"
    return " "


def _zfunc(path: list[str]) -> str:
    return "_dsv4ctl" + "".join("__" + re.sub(r"[^A-Za-z0-9_]", "_", p) for p in path)


def render_zsh(model: dict) -> str:
    """completions/_dsv4ctl: a ``#compdef`` function for fpath (or ``source`` after compinit)."""
    words: dict[tuple, str] = {}
    funcs = []
    for n in _walk(model):
        specs = []
        for o in n["options"]:
            names = o["names"]
            excl = "" if o["multiple"] else "(" + " ".join(names) + ")"
            if "--help" in names or "-h" in names:
                excl = "(- *)"
            rep = "*" if o["multiple"] else ""
            desc = "[" + _zdesc(o["help"]) + "]"
            val = ""
            if o["value"]["kind"] != "none":
                msg = _zdesc(o["names"][-1].lstrip("-"))
                val = f":{msg}:{_zaction(o['value'], words, n)}"
            for name in names:
                eq = "=" if name.startswith("--") and o["value"]["kind"] != "none" else ""
                specs.append(_zq(f"{excl}{rep}{name}{eq}{desc}{val}"))
        for a in n["args"]:
            act = _zaction(a["value"], words, n)
            if a["nargs"] == -1:
                specs.append(_zq(f"*:{_zdesc(a['name'])}:{act}"))
            else:
                specs.append(_zq(f"{'' if a['required'] else ':'}:{_zdesc(a['name'])}:{act}"))
        fn = _zfunc(n["path"])
        body = [f"{fn}() {{"]
        if n["subs"]:
            body += ["  local curcontext=\"$curcontext\" state state_descr line ret=1",
                     "  typeset -A opt_args",
                     "  _arguments -C -s \\"]
            body += [f"    {s} \\" for s in specs]
            body += ["    ': :->cmds' \\", "    '*:: :->args' && ret=0", "  case $state in", "    cmds)",
                     "      local -a cmds",
                     "      cmds=("]
            body += ["        " + _zq(s["path"][-1].replace(":", "\\:") + ":" + s["help"]) for s in n["subs"]]
            label = " ".join([PROG] + n["path"])
            body += ["      )", f"      _describe -t commands {_zq(label + ' command')} cmds && ret=0 ;;",
                     "    args)",
                     f"      curcontext=\"${{curcontext%:*:*}}:{'-'.join([PROG] + n['path'])}-$line[1]:\"",
                     "      case $line[1] in"]
            body += [f"        {_zq(s['path'][-1])}) {_zfunc(s['path'])} && ret=0 ;;" for s in n["subs"]]
            body += ["      esac ;;", "  esac", "  return ret", "}"]
        else:
            body += ["  _arguments -s \\"] + [f"    {s} \\" for s in specs] + ["    && return 0", "  return 1", "}"]
        funcs.append("\n".join(body))
    out = ["#compdef dsv4ctl", HEADER.format(c="#", shell="zsh"),
           "# Install: put this file in a folder of $fpath (e.g. ~/.zfunc, with fpath+=(~/.zfunc)",
           "# before compinit), or `source completions/_dsv4ctl` after compinit.", ""]
    # _arguments calls an action with extra compadd options, so each word list gets its own
    # argument-less function: _dsv4ctl_yaml_wN (shipped names + *.yaml/*.yml files + folders)
    # and _dsv4ctl_keys_wN (KEY=VALUE keys, completed with a removable "=").
    for (fn, *ws), wid in words.items():
        lst = " ".join(_zq(str(w)) for w in ws)
        if fn == "keyed":
            nkeys, ws = ws[0], ws[1:]
            out += [f"_dsv4ctl_keyed_{wid}() {{",
                    f"  local -a keys words; keys=({' '.join(_zq(w) for w in ws[:nkeys])})"
                    f" words=({' '.join(_zq(w) for w in ws[nkeys:])})",
                    "  if compset -P '*='; then",
                    "    _wanted names expl 'runbook' compadd -a words",
                    "  else",
                    "    _alternative 'names:runbook:compadd -a words' 'keys:condition:compadd -S = -q -a keys'",
                    "  fi",
                    "}"]
        elif fn == "yaml":
            out += [f"_dsv4ctl_yaml_{wid}() {{",
                    f"  local -a names; names=({lst})",
                    "  _alternative 'names:shipped name:compadd -a names' 'files:YAML file:_files -g \"*.(yaml|yml)(-.)\"'",
                    "}"]
        else:
            out += [f"_dsv4ctl_keys_{wid}() {{",
                    f"  local -a keys; keys=({lst})",
                    "  if compset -P '*='; then _message 'value'; else compadd -S '=' -q -a keys; fi",
                    "}"]
    out += ZSH_DYN.splitlines() + [""]
    out += funcs
    out += ["",
            "if [[ $zsh_eval_context[-1] == loadautofunc ]]; then",
            "  _dsv4ctl \"$@\"",
            "else",
            "  compdef _dsv4ctl dsv4ctl",
            "fi", ""]
    return "\n".join(out)


# The profile's groups/hosts/releases: `_dsv4ctl_dyn KIND PROFILE-INDEX PROFILE-OPTION...` finds the
# profile the line gives (an option in $opt_args, else positional PROFILE-INDEX of $line: both set
# by _arguments) and asks `dsv4ctl __complete` (no network; nothing on failure).
ZSH_DYN = r"""_dsv4ctl_dyn() {
  local what=$1 idx=$2 prof o
  shift 2
  for o in "$@"; do
    [[ -n ${opt_args[$o]} ]] && prof=${opt_args[$o]}
  done
  [[ -z $prof && $idx -gt 0 ]] && prof=${line[$idx]}
  local -a vals
  vals=(${(f)"$(command dsv4ctl __complete $what ${(Q)prof} 2>/dev/null)"})
  compadd "${expl[@]}" -a vals
}"""


# --------------------------------------------------------------------------------------- fish
def _fq(s: str) -> str:
    """A fish single-quoted word."""
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def render_fish(model: dict) -> str:
    """completions/dsv4ctl.fish: ``complete -c dsv4ctl`` rules guarded by the command path."""
    words: dict[tuple, str] = {}
    lines = []
    subs_cases, optval_cases, profarg_cases, profopt_cases = [], [], [], []
    for n in _walk(model):
        p = " ".join(n["path"])
        if n["subs"]:
            subs_cases.append(f"        case {_fq(p)}\n            echo {' '.join(s['path'][-1] for s in n['subs'])}")
        valued = [x for o in n["options"] if o["value"]["kind"] != "none" for x in o["names"]]
        if valued:
            optval_cases.append(f"        case {_fq(p)}\n            contains -- $argv[2] {' '.join(valued)}")
        idx = next((i for i, a in enumerate(n["args"]) if a["value"]["kind"] == "profile"), None)
        if idx is not None:
            profarg_cases.append(f"        case {_fq(p)}\n            echo {idx}")
        popts = [x for o in n["options"] if o["value"]["kind"] == "profile" for x in o["names"]]
        if popts:
            profopt_cases.append(f"        case {_fq(p)}\n            contains -- $argv[2] {' '.join(popts)}")
        for s in n["subs"]:
            lines.append(f"complete -c dsv4ctl -n {_fq('__dsv4ctl_at ' + _fq(p))} -f -a {_fq(s['path'][-1])}"
                         f" -d {_fq(s['help'])}")
        for o in n["options"]:
            flags = " ".join((f"-l {x[2:]}" if x.startswith("--") else f"-s {x[1:]}") for x in o["names"])
            rule = f"complete -c dsv4ctl -n {_fq('__dsv4ctl_at ' + _fq(p))} {flags}"
            rule += _fish_value(o["value"], words, option=True)
            lines.append(rule + f" -d {_fq(o['help'])}")
        for i, a in enumerate(n["args"]):
            cond = f"__dsv4ctl_arg {_fq(p)} {i}" + (" +" if a["nargs"] == -1 else "")
            val = _fish_value(a["value"], words, option=False)
            if val:
                lines.append(f"complete -c dsv4ctl -n {_fq(cond)}{val}")
    out = [HEADER.format(c="#", shell="fish"),
           "# Install: copy to ~/.config/fish/completions/dsv4ctl.fish, or `source completions/dsv4ctl.fish`.", ""]
    for ws, wid in words.items():
        out.append(f"set -g __dsv4ctl_{wid} {' '.join(_fq(w) for w in ws)}")
    out += ["", "function __dsv4ctl_subs", "    switch $argv[1]", *subs_cases, "    end", "end", "",
            "# true when option $2 of command path $1 takes a value",
            "function __dsv4ctl_takes_value", "    switch $argv[1]", *optval_cases,
            "        case '*'", "            return 1", "    end", "end", "",
            "# the position (0-based) of the positional PROFILE of command path $1",
            "function __dsv4ctl_profarg", "    switch $argv[1]", *profarg_cases, "    end", "end", "",
            "# true when option $2 of command path $1 names the profile",
            "function __dsv4ctl_profopt", "    switch $argv[1]", *profopt_cases,
            "        case '*'", "            return 1", "    end", "end", "",
            FISH_BODY, *lines, ""]
    return "\n".join(out)


def _fish_value(v: Kind, words: dict[tuple, str], option: bool) -> str:
    k = v["kind"]
    r = " -r" if option else ""
    if k == "none":
        return ""
    if k == "file":
        return f"{r} -F"
    if k == "dir":
        return f"{r} -f -a '(__fish_complete_directories (commandline -ct))'"
    if k in ("yaml", "profile"):
        return f"{r} -f -a '(__dsv4ctl_yaml {_words_id(v['words'], words)})'"
    if k == "keyed":
        return f"{r} -f -a '(__dsv4ctl_keyed {_words_id(v['keys'], words)} {_words_id(v['words'], words)})'"
    if k == "dyn":
        return f"{r} -f -a '(__dsv4ctl_dyn {v['what']})'"
    if k == "words":
        if v.get("suffix"):
            return f"{r} -f -a '(__dsv4ctl_keys {_words_id(v['words'], words)})'"
        return f"{r} -f -a {_fq(' '.join(v['words']))}"
    return f"{r} -f" if option else ""


FISH_BODY = r'''# "PATH NPOS PROFILE" of the command line before the cursor, one per line: the sub-command path,
# how many positional arguments follow it, and the profile it gives (positional or option; may be empty)
function __dsv4ctl_state
    set -l tokens (commandline -opc)
    set -e tokens[1]
    set -l path ''
    set -l npos 0
    set -l pending ''
    set -l profile ''
    for t in $tokens
        if test -n "$pending"
            __dsv4ctl_profopt "$path" $pending; and set profile $t
            set pending ''
            continue
        end
        switch $t
            case '--'
            case '--*=*'
                set -l kv (string split -m 1 = -- $t)
                __dsv4ctl_profopt "$path" $kv[1]; and set profile $kv[2]
            case '-*'
                if __dsv4ctl_takes_value "$path" $t
                    set pending $t
                end
            case '*'
                if test $npos = 0; and contains -- $t (string split ' ' -- (__dsv4ctl_subs "$path"))
                    set path (string trim -- "$path $t")
                else
                    set -l at (__dsv4ctl_profarg "$path")
                    test "$npos" = "$at"; and set profile $t
                    set npos (math $npos + 1)
                end
        end
    end
    echo "$path"
    echo $npos
    echo "$profile"
end

# at command path $1, not after an option that wants a value
function __dsv4ctl_at
    set -l st (__dsv4ctl_state)
    test "$st[1]" = "$argv[1]"
end

# at command path $1, completing positional argument $2 (0-based; "$3" = "+" for $2 and after)
function __dsv4ctl_arg
    set -l cur (commandline -ct)
    string match -q -- '-*' $cur; and return 1
    set -l st (__dsv4ctl_state)
    test "$st[1]" = "$argv[1]"; or return 1
    set -l subs (__dsv4ctl_subs "$argv[1]")
    test -z "$subs"; or return 1
    if test "$argv[3]" = "+"
        test $st[2] -ge $argv[2]
    else
        test $st[2] = $argv[2]
    end
end

# shipped names (word list $1) + *.yaml/*.yml files + folders
function __dsv4ctl_yaml
    set -l names __dsv4ctl_$argv[1]
    printf '%s\n' $$names
    set -l cur (commandline -ct)
    for f in $cur*.yaml $cur*.yml
        test -f $f; and echo $f
    end
    __fish_complete_directories $cur
end

# [KEY=]WORD values: words (list $2), or keys (list $1) followed by "=", then KEY=word
function __dsv4ctl_keyed
    set -l cur (string replace -r -- '^--[^=]*=' '' (commandline -ct))
    set -l keys __dsv4ctl_$argv[1]
    set -l words __dsv4ctl_$argv[2]
    if string match -q -- '*=*' $cur
        set -l key (string split -m 1 = -- $cur)[1]
        printf "%s\n" $key=$$words
    else
        printf '%s\n' $$words
        printf '%s=\n' $$keys
    end
end

# a value of the profile on the command line (groups, hosts, releases: $1), from
# `dsv4ctl __complete` (no network; nothing on failure)
function __dsv4ctl_dyn
    set -l st (__dsv4ctl_state)
    command dsv4ctl __complete $argv[1] "$st[3]" 2>/dev/null
end

# KEY=VALUE keys (word list $1), each followed by "="
function __dsv4ctl_keys
    set -l cur (commandline -ct)
    string match -q -- '*=*' $cur; and return
    set -l keys __dsv4ctl_$argv[1]
    printf '%s=\n' $$keys
end

complete -c dsv4ctl -f
'''


def generate() -> dict[str, str]:
    """File name (in completions/) -> content, generated from the live CLI."""
    model = build_model()
    return {"dsv4ctl.bash": render_bash(model), "_dsv4ctl": render_zsh(model), "dsv4ctl.fish": render_fish(model)}


def stale(out_dir: Path = OUT_DIR) -> list[str]:
    """Names of the files in ``out_dir`` that differ from a fresh generation (or are missing)."""
    return [name for name, text in generate().items()
            if not (out_dir / name).is_file() or (out_dir / name).read_text() != text]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when completions/ is stale; write nothing")
    ap.add_argument("--out", type=Path, default=OUT_DIR, help="output folder (default: completions/)")
    a = ap.parse_args(argv)
    if a.check:
        bad = stale(a.out)
        for name in bad:
            print(f"stale: {a.out / name} (regenerate: {REGEN})", file=sys.stderr)
        return 1 if bad else 0
    a.out.mkdir(parents=True, exist_ok=True)
    for name, text in generate().items():
        (a.out / name).write_text(text)
        print(f"wrote {a.out / name}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
