# Capture what zsh's completion system offers for command lines, through a real interactive
# zsh on a pseudo-terminal (zsh/zpty): compinit, source the completion SCRIPT, then for each LINE
# type LINE + TAB and print every candidate compadd received, one per line ("<NEXT>" between
# the candidates of two LINEs). TAB is bound to a widget that completes and then prints a marker,
# which ends the capture of that LINE (no waiting for silence); then the line is cleared (^U).
# Nothing is typed ahead of a completion: a command a completion runs (dsv4ctl __complete) may
# make zsh flush the terminal's pending input.
#   usage: zsh -f zcap.zsh SCRIPT 'LINE' ['LINE'...]
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "PROMPT=''; RPROMPT=''; unsetopt zle_bracketed_paste 2>/dev/null"
zpty -w z "autoload -U compinit; compinit -u -D"
zpty -w z "source ${(q)1}"
zpty -w z 'compadd () { if [[ ${@[1,(i)(-|--)]} == *-(O|A|D)\ * ]]; then builtin compadd "$@"; return $?; fi; typeset -a __h; builtin compadd -A __h "$@"; (( $#__h )) || return 1; builtin compadd "$@"; local h; for h in $__h; do print -r -- "<CAND>$h</CAND>"; done; }'
zpty -w z "zstyle ':completion:*' list-prompt ''; zstyle ':completion:*' menu no; zstyle ':completion:*' insert-tab false"
zpty -w z "__tab() { zle expand-or-complete; print -r -- '<TAB''DONE>'; }; zle -N __tab; bindkey '^I' __tab"
zpty -w z "print -r -- '<READY>'"
while zpty -r z line; do [[ $line == *'<READY>'* && $line != *print* ]] && break; done
shift
integer first=1
for cmdline in "$@"; do
  (( first )) || print -r -- '<NEXT>'
  first=0
  zpty -n -w z "$cmdline"$'\t'
  out=""
  line=""
  while zpty -r z line; do
    out+=$line
    [[ $line == *'<TABDONE>'* ]] && break
    line=""
  done
  zpty -n -w z $'\C-u'
  print -r -- ${(F)${(M)${(s:</CAND>:)out}:#*<CAND>*}//*<CAND>/}
done
zpty -d z
