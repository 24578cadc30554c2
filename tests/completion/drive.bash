# Call the bash completion function of SCRIPT the way readline does for the command LINE with
# the cursor at its end, and print COMPREPLY, one candidate per line.
#   usage: bash drive.bash SCRIPT 'LINE'
source "$1"
COMP_LINE="$2"
COMP_POINT=${#COMP_LINE}
_dsv4ctl 2>/dev/null
printf '%s\n' "${COMPREPLY[@]}"
