"""The world every layer above acts through: the `Sys` interface of file-system and mount steps
(sysops), the failpoints that inject faults into them, and the history they are recorded in."""
