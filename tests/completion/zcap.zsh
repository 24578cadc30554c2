# Capture what zsh's completion system offers for a command line, through a real interactive
# zsh on a pseudo-terminal (zsh/zpty): compinit, source the completion SCRIPT, type LINE + TAB,
# and print every candidate compadd received, one per line.
#   usage: zsh -f zcap.zsh SCRIPT 'LINE'
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "PROMPT=''; RPROMPT=''; unsetopt zle_bracketed_paste 2>/dev/null"
zpty -w z "autoload -U compinit; compinit -u -D"
zpty -w z "source ${(q)1}"
zpty -w z 'compadd () { if [[ ${@[1,(i)(-|--)]} == *-(O|A|D)\ * ]]; then builtin compadd "$@"; return $?; fi; typeset -a __h; builtin compadd -A __h "$@"; (( $#__h )) || return 1; builtin compadd "$@"; local h; for h in $__h; do print -r -- "<CAND>$h</CAND>"; done; }'
zpty -w z "zstyle ':completion:*' list-prompt ''; zstyle ':completion:*' menu no; zstyle ':completion:*' insert-tab false"
zpty -w z "print -r -- '<READY>'"
while zpty -r z line; do [[ $line == *'<READY>'* && $line != *print* ]] && break; done
zpty -n -w z "$2"$'\t'
out=""
integer n=0
while zpty -r -t z line 2>/dev/null || { sleep 0.05; (( ++n < 40 )) }; do
  [[ -n $line ]] && out+=$line
  line=""
done
print -r -- ${(F)${(M)${(s:</CAND>:)out}:#*<CAND>*}//*<CAND>/}
zpty -d z
