#!/usr/bin/env bash
# Put Finetune Studio into the desktop's application menu: the .desktop entry, the app icon in the
# hicolor theme and the AppStream metainfo, in the user's XDG data folder (no root needed).
#
#   bash packaging/linux/install.sh                   # into ${XDG_DATA_HOME:-~/.local/share}
#   bash packaging/linux/install.sh --exec "$PWD/.venv/bin/finetune-studio"
#   bash packaging/linux/install.sh --prefix /usr/local   # system-wide, into /usr/local/share (as root)
#   bash packaging/linux/install.sh --uninstall       # same options, removes what install put there
#
# It installs only the menu entry: the program itself comes from `pip install` (the
# `finetune-studio` command) or from the PyInstaller bundle (see packaging/README.md). When that
# command is not on the desktop session's PATH (a venv, a bundle folder), give its absolute path with
# --exec and the entry will start it from there.
set -euo pipefail

APP_ID="io.github.finetune_studio.FinetuneStudio"
ICON_SIZES=(16 32 48 64 128 256)
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
ICONS_SRC="${FINETUNE_STUDIO_ICONS:-$ROOT/resources/icons}"

usage() {
    sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    cat <<EOF

Options:
  --prefix DIR   install into DIR/share instead of \${XDG_DATA_HOME:-~/.local/share}
  --exec PATH    command the menu entry runs (default: finetune-studio, looked up on PATH)
  --uninstall    remove the entry, icons and metainfo from the same place
  -h, --help     this text
Environment: XDG_DATA_HOME (default target), FINETUNE_STUDIO_ICONS (icon folder, default resources/icons)
EOF
}

DATA_DIR="${XDG_DATA_HOME:-$HOME/.local/share}"
EXEC_CMD=""
UNINSTALL=0
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) [ $# -ge 2 ] || { echo "install.sh: --prefix needs a folder" >&2; exit 2; }
                  DATA_DIR="${2%/}/share"; shift 2 ;;
        --prefix=*) DATA_DIR="${1#--prefix=}"; DATA_DIR="${DATA_DIR%/}/share"; shift ;;
        --exec) [ $# -ge 2 ] || { echo "install.sh: --exec needs a path" >&2; exit 2; }
                EXEC_CMD="$2"; shift 2 ;;
        --exec=*) EXEC_CMD="${1#--exec=}"; shift ;;
        --uninstall) UNINSTALL=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
    esac
done

APPS_DIR="$DATA_DIR/applications"
ICON_THEME="$DATA_DIR/icons/hicolor"
META_DIR="$DATA_DIR/metainfo"
DESKTOP="$APP_ID.desktop"
METAINFO="$APP_ID.metainfo.xml"

refresh_caches() {
    if command -v update-desktop-database >/dev/null 2>&1; then
        update-desktop-database -q "$APPS_DIR" || echo "note: update-desktop-database failed (harmless)" >&2
    fi
    if command -v gtk-update-icon-cache >/dev/null 2>&1 && [ -d "$ICON_THEME" ]; then
        # -t: a user's hicolor folder usually has no index.theme of its own.
        gtk-update-icon-cache -q -f -t "$ICON_THEME" || echo "note: gtk-update-icon-cache failed (harmless)" >&2
    fi
}

if [ "$UNINSTALL" = 1 ]; then
    removed=0
    for f in "$APPS_DIR/$DESKTOP" "$META_DIR/$METAINFO" "$ICON_THEME/scalable/apps/$APP_ID.svg"; do
        [ -e "$f" ] && rm -f "$f" && echo "removed $f" && removed=$((removed + 1))
    done
    for size in "${ICON_SIZES[@]}"; do
        f="$ICON_THEME/${size}x${size}/apps/$APP_ID.png"
        [ -e "$f" ] && rm -f "$f" && echo "removed $f" && removed=$((removed + 1))
    done
    [ -d "$APPS_DIR" ] && refresh_caches
    echo "uninstalled ($removed files) from $DATA_DIR"
    exit 0
fi

# The command the menu runs. Desktop entries quote with double quotes; keep to paths that need no
# other escaping.
if [ -n "$EXEC_CMD" ]; then
    case "$EXEC_CMD" in
        /*) ;;
        *) EXEC_CMD="$(cd "$(dirname "$EXEC_CMD")" && pwd)/$(basename "$EXEC_CMD")" ;;
    esac
    case "$EXEC_CMD" in
        *[\"\`\$\\%]*) echo "install.sh: --exec path must not contain \" \` \$ \\ or %: $EXEC_CMD" >&2; exit 2 ;;
    esac
    [ -x "$EXEC_CMD" ] || echo "warning: $EXEC_CMD is not an executable file (yet); the menu entry will not start until it is" >&2
    case "$EXEC_CMD" in
        *" "*) EXEC_FIELD="\"$EXEC_CMD\"" ;;
        *) EXEC_FIELD="$EXEC_CMD" ;;
    esac
else
    EXEC_FIELD="finetune-studio"
    if ! command -v finetune-studio >/dev/null 2>&1; then
        echo "warning: 'finetune-studio' is not on PATH; install it (pip install -e .) or rerun with" \
             "--exec /absolute/path/to/finetune-studio, or the menu entry will not start" >&2
    fi
fi

mkdir -p "$APPS_DIR" "$META_DIR"
sed -e "s|^Exec=.*|Exec=$EXEC_FIELD|" -e "s|^TryExec=.*|TryExec=$EXEC_FIELD|" \
    "$HERE/$DESKTOP" > "$APPS_DIR/$DESKTOP.tmp"
if [ "$EXEC_FIELD" != "${EXEC_FIELD#\"}" ]; then
    # TryExec takes a bare path, never a quoted one.
    sed -i "s|^TryExec=.*|TryExec=$EXEC_CMD|" "$APPS_DIR/$DESKTOP.tmp"
fi
chmod 644 "$APPS_DIR/$DESKTOP.tmp"
mv "$APPS_DIR/$DESKTOP.tmp" "$APPS_DIR/$DESKTOP"
echo "installed $APPS_DIR/$DESKTOP (Exec=$EXEC_FIELD)"
install -m 644 "$HERE/$METAINFO" "$META_DIR/$METAINFO"
echo "installed $META_DIR/$METAINFO"

icons=0
for size in "${ICON_SIZES[@]}"; do
    src="$ICONS_SRC/app-$size.png"
    if [ -f "$src" ]; then
        install -D -m 644 "$src" "$ICON_THEME/${size}x${size}/apps/$APP_ID.png"
        icons=$((icons + 1))
    fi
done
if [ -f "$ICONS_SRC/app.svg" ]; then
    install -D -m 644 "$ICONS_SRC/app.svg" "$ICON_THEME/scalable/apps/$APP_ID.svg"
    icons=$((icons + 1))
fi
if [ "$icons" = 0 ]; then
    echo "warning: no app icon found in $ICONS_SRC (expected app.svg and app-<size>.png for sizes" \
         "${ICON_SIZES[*]}); the menu entry will show a generic icon. Rerun once they exist." >&2
else
    echo "installed $icons icon files under $ICON_THEME"
fi

refresh_caches
echo "done: 'Finetune Studio' should appear in the application menu (log out and in if it does not)"
