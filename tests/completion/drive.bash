# Call the bash completion function of SCRIPT the way readline does for the command LINE with
# the cursor at its end, and print COMPREPLY, one candidate per line (whatever the function
# writes on stderr is left on stderr: a completion must write nothing there).
#   usage: bash drive.bash SCRIPT 'LINE'
source "$1"
COMP_LINE="$2"
COMP_POINT=${#COMP_LINE}
_dsv4ctl
printf '%s\n' "${COMPREPLY[@]}"
