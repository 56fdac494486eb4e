/** Types of folder-rules.mjs (the per-folder import rules read from the folders' READMEs). */
export declare const RULED_PACKAGES: readonly string[];
export declare class FolderRulesError extends Error {}
export interface FolderException {
  from: string;
  to: string;
  why: string;
}
export interface Folder {
  pkg: string;
  folder: string;
  readme: string;
  mayImport: string[];
  exceptions: FolderException[];
}
export declare function readFolder(root: string, pkg: string, folder: string): Folder;
export declare function foldersOf(root: string, pkg: string): string[];
export declare function readAllFolders(root: string): Folder[];
export declare function findAllowedCycle(folders: Folder[]): { pkg: string; cycle: string[] } | null;
export declare function folderRules(root: string): { forbidden: object[]; required: object[]; folders: Folder[] };
