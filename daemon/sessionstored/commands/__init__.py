# The daemon's entry points: `sessionstored` (serve), `sessionstored rekey` and
# `sessionstored restore`, and where the key comes from. They open the store and
# start the layers below; nothing below imports them.
